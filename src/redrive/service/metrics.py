"""The retry service's Prometheus metrics.

Each service instance has its own registry, so several can run in one process (the
tests do). The pending gauges are read from the store when Prometheus scrapes, cached
briefly so a burst of scrapes does not turn into a burst of queries; readiness is
asked at each scrape (what /readyz answers, as a number an alert can watch).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from redrive.clock import now_ms

log = structlog.get_logger("redrive.metrics")

LATENESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60)


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
        self.lateness = Histogram(
            "redrive_retry_lateness_seconds",
            "Time its batch was acknowledged by the broker minus due time, per delivered retry.",
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        r.register(_PendingCollector(pending_by_destination, oldest_due_ms))
        if readiness is not None:
            r.register(_ReadyCollector(readiness))
