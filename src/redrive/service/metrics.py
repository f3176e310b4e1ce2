"""The retry service's Prometheus metrics.

Each service instance has its own registry, so several can run in one process (the
tests do). The pending gauges (and the error groups' surge gauges,
:mod:`.group_metrics`) are read from the store when Prometheus scrapes, cached
briefly so a burst of scrapes does not turn into a burst of queries; readiness is
asked at each scrape (what /readyz answers, as a number an alert can watch).
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator

import structlog
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from redrive.clock import now_ms
from redrive.service.group_metrics import ErrorGroupCollector
from redrive.service.store import GroupSurge

log = structlog.get_logger("redrive.metrics")

LATENESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60)


class LatenessHistogram(Collector):
    """``redrive_retry_lateness_seconds``, observed a delivered batch at a time.

    Every retry of a batch is delivered at one instant (when the broker acknowledged
    the batch), so how many fall in each bucket follows from the batch's due times,
    sorted, with one bisection per bucket. prometheus_client's Histogram takes a lock
    and walks its buckets in Python for every value: 4% of the service's interpreter
    time under benchmark 2. What is exposed is what that Histogram would expose for
    the same values, bucket for bucket (tests/unit/test_lateness_histogram.py).
    """

    def __init__(self, name: str, documentation: str, buckets_s: Iterable[float]) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = tuple(buckets_s)
        # Bucket labels written as the Histogram writes them ("0.001", "1.0", "+Inf").
        self._labels = [floatToGoString(b) for b in (*self._bounds, float("inf"))]  # type: ignore[no-untyped-call]
        # Lateness is a whole number of milliseconds: the most that still falls within
        # each bucket, as the Histogram compares it (ms / 1000 <= bound, in floats).
        self._within_ms = tuple(_most_ms_within(bound) for bound in self._bounds)
        self._lock = threading.Lock()  # the scheduler observes, a scrape collects
        self._cumulative = [0] * len(self._bounds)
        self._count = 0
        self._sum_ms = 0

    def observe_batch(self, now_ms: int, due_ms: Iterable[int]) -> None:
        """Count retries delivered at `now_ms`, each `now_ms - due` late (0 if due after)."""
        dues = sorted(due_ms)  # claimed in due order: already sorted, a linear check
        if not dues:
            return
        n = len(dues)
        due_by_now = bisect_right(dues, now_ms)
        late_ms = due_by_now * now_ms - sum(dues[:due_by_now])
        within = [n - bisect_left(dues, now_ms - most) for most in self._within_ms]
        with self._lock:
            self._cumulative = [a + b for a, b in zip(self._cumulative, within, strict=True)]
            self._count += n
            self._sum_ms += late_ms

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            cumulative, count, sum_ms = list(self._cumulative), self._count, self._sum_ms
        counts = [*cumulative, count]
        yield HistogramMetricFamily(
            self._name,
            self._documentation,
            buckets=list(zip(self._labels, counts, strict=True)),
            sum_value=sum_ms / 1000,
        )


def _most_ms_within(bound_s: float) -> int:
    """The greatest whole number of milliseconds `ms` with ms / 1000 <= bound_s."""
    ms = int(bound_s * 1000)
    while (ms + 1) / 1000 <= bound_s:
        ms += 1
    while ms / 1000 > bound_s:
        ms -= 1
    return ms


class _PendingCollector(Collector):
    """``redrive_pending`` by destination, and how overdue the oldest due retry is."""

    def __init__(
        self,
        read: Callable[[], dict[str, int]],
        oldest_due: Callable[[], int | None],
        ttl_s: float = 5.0,
    ) -> None:
        self._read = read
        self._oldest_due = oldest_due
        self._ttl_s = ttl_s
        self._cached: dict[str, int] = {}
        self._cached_oldest: int | None = None
        self._read_at = 0.0

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily(
            "redrive_pending", "Retries waiting for their due time.", labels=["destination"]
        )
        overdue = GaugeMetricFamily(
            "redrive_pending_overdue_seconds",
            "How long the oldest retry that is due has waited past its due time, "
            "delivered or not yet (0 when none is due): a scheduler that falls behind "
            "or stopped shows here before any lateness is observed.",
        )
        if time.monotonic() - self._read_at > self._ttl_s:
            try:
                self._cached = self._read()
                self._cached_oldest = self._oldest_due()
                self._read_at = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - a scrape must not fail while the store is down
                log.warning("pending figures unavailable; serving the last ones", error=str(exc))
        for destination, count in sorted(self._cached.items()):
            gauge.add_metric([destination], count)
        oldest = self._cached_oldest
        overdue.add_metric([], max(now_ms() - oldest, 0) / 1000 if oldest is not None else 0.0)
        yield gauge
        yield overdue


class _ReadyCollector(Collector):
    """``redrive_service_ready``: 1 when /readyz would answer 200, else 0."""

    def __init__(self, readiness: Callable[[], dict[str, bool]]) -> None:
        self._readiness = readiness

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily(
            "redrive_service_ready",
            "1 when the service is ready (store reachable, every role healthy), else 0.",
        )
        try:
            ready = all(self._readiness().values())
        except Exception as exc:  # noqa: BLE001 - not ready, and the scrape goes on
            log.warning("readiness unavailable", error=str(exc))
            ready = False
        gauge.add_metric([], 1.0 if ready else 0.0)
        yield gauge


class ServiceMetrics:
    def __init__(
        self,
        pending_by_destination: Callable[[], dict[str, int]],
        oldest_due_ms: Callable[[], int | None] = lambda: None,
        readiness: Callable[[], dict[str, bool]] | None = None,
        error_group_surges: Callable[[int], list[GroupSurge]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.received = Counter(
            "redrive_requests_received",
            "Retry requests read from the requests topic.",
            registry=r,
        )
        self.invalid = Counter(
            "redrive_requests_invalid",
            "Requests refused (they became dead letters).",
            ["reason"],
            registry=r,
        )
        self.ingested = Counter(
            "redrive_dead_letters_ingested",
            "Dead letters ingested from dead-letter topics (the ingest setting), by the "
            "format they were read as.",
            ["format"],
            registry=r,
        )
        self.ingested_again = Counter(
            "redrive_dead_letters_read_again",
            "Records of dead-letter topics read again (intake stopped before it "
            "committed them): stored once already, so not counted as ingested, by format.",
            ["format"],
            registry=r,
        )
        self.repeats = Counter(
            "redrive_requests_repeated",
            "Requests dropped because their identity was accepted before (a sender "
            "repeating itself after a crash), by what they were: retry, behind, release, "
            "dead_letter.",
            ["stage"],
            registry=r,
        )
        self.scheduled = Counter(
            "redrive_requests_scheduled", "Requests stored as pending retries.", registry=r
        )
        self.published = Counter(
            "redrive_retries_published",
            "Retries delivered to their destination.",
            ["destination"],
            registry=r,
        )
        self.dead_lettered = Counter(
            "redrive_dead_lettered",
            "Messages written to the dead-letter store.",
            ["reason"],
            registry=r,
        )
        self.store_errors = Counter(
            "redrive_store_errors",
            "Failed attempts to reach PostgreSQL.",
            ["operation"],
            registry=r,
        )
        self.delivery_errors = Counter(
            "redrive_delivery_errors",
            "Failed deliveries to a destination.",
            ["error"],
            registry=r,
        )
        self.lateness = LatenessHistogram(
            "redrive_retry_lateness_seconds",
            "Time its batch was acknowledged by the broker minus due time, per delivered retry.",
            LATENESS_BUCKETS,
        )
        r.register(self.lateness)
        r.register(_PendingCollector(pending_by_destination, oldest_due_ms))
        if readiness is not None:
            r.register(_ReadyCollector(readiness))
        if error_group_surges is not None:
            r.register(ErrorGroupCollector(error_group_surges))
