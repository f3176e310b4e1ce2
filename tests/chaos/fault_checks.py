"""What the fault tests (tests/chaos/test_faults*.py) count, probe and do: when
faults strike, the requests they make, what came back, whether each part answers
again after its faults, a service killed by SIGKILL, repeats explained."""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from collections.abc import Callable

from confluent_kafka.admin import AdminClient, NewTopic

from redrive.deadlines import Deadline
from tests.chaos.harness import (
    AppProcess,
    Request,
    Service,
    duplicates_of,
    extra,
    now_ms,
    sleep_until,
    wait_for,
)
from tests.integration.service_harness import (
    Collector,
    Record,
    produce,
    request_headers,
)

APP_STRATEGIES = ["blocking", "topics", "service"]
PROBES = 6


def fault_times(rng: random.Random, count: int, span_s: float, lo: float, hi: float) -> list[float]:
    """`count` moments in (0, span_s), one in each equal slice, at [lo, hi) of its slice."""
    width = span_s / count
    return [i * width + rng.uniform(lo, hi) * width for i in range(count)]


def requests_to(destination: str, rng: random.Random, prefix: str) -> Callable[[int], Record]:
    """Retry requests straight to the service, each due 0.2 to 3 s after it is made."""

    def make(i: int) -> Record:
        return {
            "key": f"k{i % 31}".encode(),
            "value": f"{prefix}-{i:06d}".encode(),
            "headers": request_headers(destination, now_ms() + rng.randrange(200, 3000)),
        }

    return make


def received_values(collector: Collector) -> Counter[bytes]:
    return Counter(d.value for d in collector.received if d.value is not None)


def collect_all(collector: Collector, sent: set[bytes], timeout_s: float) -> Counter[bytes]:
    """Collect until every sent value arrived (or the timeout), then until quiet."""
    deadline = Deadline(timeout_s)
    seen: set[bytes] = set()
    index = 0
    while not deadline.passed():
        seen.update(d.value for d in collector.received[index:] if d.value is not None)
        index = len(collector.received)
        if sent <= seen:
            break
        collector.poll_until(sys.maxsize, 0.5)
    collector.drain(quiet_s=2)
    return received_values(collector)


def early_deliveries(collector: Collector) -> int:
    """Deliveries that arrived before their retry-at (never allowed, even after a crash)."""
    early = 0
    for delivery in collector.received:
        due = delivery.header("redrive-retry-at")
        if due is not None and delivery.received_ms < int(due):
            early += 1
    return early


def probe_service(bootstrap: str, requests_topic: str, destination: str, c: Collector) -> bool:
    """Requests made after the faults go through the (restarted) service."""
    probes = {f"probe-{i}".encode() for i in range(PROBES)}
    produce(
        bootstrap,
        requests_topic,
        [
            {"key": p, "value": p, "headers": request_headers(destination, now_ms() + 300)}
            for p in sorted(probes)
        ],
    )
    return probes <= collect_all(c, probes, 60).keys()


def probe_app(bootstrap: str, app: AppProcess) -> bool:
    """New records, failing 0 to 2 times, are handled by the app's current process."""
    probes = [f"probe-{app.strategy}-{i}:f{i % 3}" for i in range(PROBES)]
    produce(bootstrap, app.topic, [{"key": p.encode(), "value": p.encode()} for p in probes])
    assert app.proc is not None
    pid = app.proc.pid

    def done() -> bool:
        handled = {e["value"] for e in app.events() if e["event"] == "ok" and e["pid"] == pid}
        return set(probes) <= handled

    return wait_for(done, 90, 0.5)


def kill_service(
    service: Service,
    kills: list[float],
    downtimes: list[float],
    t0: float,
    made: Callable[[], int],
    pump: Callable[[], None] | None = None,
    moment: Callable[[], bool] | None = None,
) -> list[str]:
    """SIGKILL the service `kills` seconds after `t0`, restart it after each downtime;
    what happened, for the report (`made`: how many records the load made so far).
    `moment`: from then on, kill as soon as it says so (within a second)."""
    faults = []
    for at, down in zip(kills, downtimes, strict=True):
        sleep_until(t0, at, pump)
        waited = time.monotonic()
        timely = moment is not None and wait_for(moment, 1.0, 0)
        service.kill()
        how = f" ({time.monotonic() - waited:.2f}s later, delivering)" if timely else ""
        faults.append(f"kill at {at:.1f}s{how} after {made()} made, down {down:.1f}s")
        sleep_until(time.monotonic(), down, pump)
        service.start()
    return faults


def repeats_explained(requests: list[Request], deliveries: list[Request]) -> tuple[int, int]:
    """Duplicate requests (extra copies of one redrive-id) in all, and those not
    explained by a repeat delivery: a request for attempt N+1 made twice is explained
    when the delivery of attempt N of the same failure reached the App twice (each
    copy failed again and handed the next attempt off: what the App's repeat window
    prevents, as it remembers deliveries handed off as well as handled)."""
    delivered = Counter((d.group, d.origin, d.attempt) for d in deliveries)
    first = {r.id: r for r in requests}
    repeated = duplicates_of(requests)
    unexplained = {
        i: n
        for i, n in repeated.items()
        if (r := first[i]).attempt is None or delivered[(r.group, r.origin, r.attempt - 1)] < n
    }
    return extra(repeated), extra(Counter(unexplained))


def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, num_partitions=partitions) for n in names])
    for future in futures.values():
        future.result(timeout=60)
