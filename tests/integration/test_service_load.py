"""The retry service under load and under faults: nothing lost, order kept, duplicates
counted. Each test prints a report line (pytest -s shows it; -rA keeps it)."""

from __future__ import annotations

import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from redrive.local.postgres import LocalPostgres
from redrive.ports import free_port
from redrive.service import group_marks
from tests.integration.service_harness import (
    Collector,
    Delivery,
    ServiceProcess,
    committed_metadata,
    fresh_database,
    now_ms,
    pending_count,
    produce,
    request_headers,
    running_service,
    settings_for,
    store_id,
    wait_until,
)

pytestmark = pytest.mark.integration

N = 10_000


def make_requests(
    destination: str, n: int, spread_ms: int, lead_ms: int
) -> list[dict[str, object]]:
    """n requests with unique values, random due times in [now+lead, now+lead+spread)."""
    rng = random.Random(7)
    start = now_ms() + lead_ms
    return [
        {
            "key": f"key-{i % 97}".encode(),
            "value": f"msg-{i}".encode(),
            "headers": request_headers(destination, start + rng.randrange(spread_ms)),
        }
        for i in range(n)
    ]


def due_of(delivery: Delivery) -> int:
    raw = delivery.header("redrive-retry-at")
    assert raw is not None
    return int(raw)


def report(name: str, deliveries: list[Delivery], expected: int) -> tuple[int, int]:
    counts = Counter(d.value for d in deliveries)
    missing = expected - len(counts)
    duplicates = sum(c - 1 for c in counts.values())
    lateness = sorted(d.received_ms - due_of(d) for d in deliveries)
    p50 = statistics.median(lateness) if lateness else 0
    p99 = lateness[int(len(lateness) * 0.99) - 1] if lateness else 0
    print(
        f"\n[{name}] delivered {len(counts)}/{expected} unique, {duplicates} duplicates, "
        f"{missing} missing; lateness ms p50={p50} p99={p99} max={max(lateness, default=0)} "
        f"min={min(lateness, default=0)}"
    )
    return missing, duplicates


def test_10000_random_due_times_all_arrive_once_in_due_order(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    """Due order is the order of what the store holds: a request that reaches the
    service after its due time (intake behind on a loaded machine) is delivered when it
    arrives, after others due later. So intake stores every request first, and only
    then does a scheduler (a second instance, on the same database) start."""
    destination = new_topic("load", partitions=3)
    db = fresh_database(database_url)
    settings = settings_for(bootstrap, db, allowed_destinations=[destination])
    records = make_requests(destination, N, spread_ms=20_000, lead_ms=3_000)
    collector = Collector(bootstrap, destination)
    with running_service(settings.model_copy(update={"roles": ["intake"]})):
        produce(bootstrap, settings.requests_topic, records)
        wait_until(lambda: pending_count(db) == N, 90, f"intake to store the {N} requests")
        with running_service(settings.model_copy(update={"roles": ["scheduler"]})):
            deliveries = collector.poll_until(N, 90)
            deliveries = collector.drain(quiet_s=2)
    collector.close()
    missing, duplicates = report("10k clean", deliveries, N)
    assert missing == 0 and duplicates == 0
    assert all(d.received_ms >= due_of(d) for d in deliveries), "a retry arrived early"
    for partition in range(3):
        dues = [
            due_of(d)
            for d in sorted(deliveries, key=lambda d: d.offset)
            if d.partition == partition
        ]
        assert dues == sorted(dues), f"partition {partition} out of due order"
    assert pending_count(db) == 0


def test_sigkill_mid_run_then_restart_loses_nothing(
    bootstrap: str, database_url: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    destination = new_topic("killed", partitions=3)
    db = fresh_database(database_url)
    # A short lease so the restarted instance reclaims the dead one's rows quickly.
    settings = settings_for(bootstrap, db, allowed_destinations=[destination], lease_seconds=2)
    records = make_requests(destination, N, spread_ms=8_000, lead_ms=2_000)
    collector = Collector(bootstrap, destination)
    first = ServiceProcess(settings, tmp_path / "first.log")
    first.start()
    produce(bootstrap, settings.requests_topic, records)
    collector.poll_until(N // 3, 60)  # well into the run
    first.kill()
    killed_after = len(collector.received)
    second = ServiceProcess(settings, tmp_path / "second.log")
    second.start()
    try:
        collector.poll_until(N, 90)
        deliveries = collector.drain(quiet_s=3)
    finally:
        assert second.terminate() == 0
        collector.close()
    missing, _duplicates = report(f"SIGKILL after {killed_after} deliveries", deliveries, N)
    assert missing == 0, f"{missing} requests lost"
    assert all(d.received_ms >= due_of(d) for d in deliveries), "a retry arrived early"
    assert pending_count(db) == 0


def test_two_processes_on_one_database_share_the_work(
    bootstrap: str, database_url: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    destination = new_topic("shared", partitions=3)
    db = fresh_database(database_url)
    settings = settings_for(bootstrap, db, allowed_destinations=[destination])
    records = make_requests(destination, N, spread_ms=10_000, lead_ms=4_000)
    services = [ServiceProcess(settings, tmp_path / f"serve-{i}.log") for i in range(2)]
    for service in services:
        service.start()
    collector = Collector(bootstrap, destination)
    try:
        produce(bootstrap, settings.requests_topic, records)
        collector.poll_until(N, 90)
        deliveries = collector.drain(quiet_s=2)
    finally:
        codes = [service.terminate() for service in services]
        collector.close()
    missing, duplicates = report("two processes", deliveries, N)
    assert codes == [0, 0]
    assert missing == 0 and duplicates == 0
    # Both instances delivered (the work was shared, not done by one while one idled).
    logs = [(tmp_path / f"serve-{i}.log").read_text() for i in range(2)]
    assert all('"intake started"' in text for text in logs)
    # One store: each commit names it, and neither refused the other.
    mark = group_marks.settled(store_id(db))
    marks = committed_metadata(bootstrap, settings.group_id, settings.requests_topic)
    assert set(marks.values()) == {mark}


@pytest.fixture
def own_postgres(tmp_path: Path) -> LocalPostgres:
    """A PostgreSQL of this test's own, which it may stop without disturbing others."""
    server = LocalPostgres(tmp_path / "pg", free_port())
    server.start(quiet=True)
    yield server  # type: ignore[misc]
    server.stop()


def test_postgres_down_for_10s_under_load_loses_nothing(
    bootstrap: str, own_postgres: LocalPostgres, new_topic: Callable[..., str]
) -> None:
    destination = new_topic("outage", partitions=2)
    settings = settings_for(
        bootstrap,
        own_postgres.url(),
        allowed_destinations=[destination],
        store_retry_max_seconds=1.0,
    )
    total = 0
    with running_service(settings) as service:
        collector = Collector(bootstrap, destination)
        # A steady load: a batch of 200 requests every half second for 20 s, each due
        # within 3 s; PostgreSQL is stopped from 5 s to 15 s.
        started = time.monotonic()
        stopped_at = restarted_at = None
        while time.monotonic() - started < 20:
            batch = make_requests(destination, 200, spread_ms=3_000, lead_ms=200)
            for i, record in enumerate(batch):
                record["value"] = f"msg-{total + i}".encode()
            produce(bootstrap, settings.requests_topic, batch)
            total += len(batch)
            elapsed = time.monotonic() - started
            if stopped_at is None and elapsed >= 5:
                own_postgres.stop()
                stopped_at = elapsed
            if stopped_at is not None and restarted_at is None and elapsed >= stopped_at + 10:
                own_postgres.start(quiet=True)
                restarted_at = elapsed
            collector.poll_until(total, 0.5)
        assert stopped_at is not None and restarted_at is not None
        collector.poll_until(total, 120)
        deliveries = collector.drain(quiet_s=3)
        collector.close()
        errors = service.metrics.store_errors.labels("insert")._value.get()
        ready = service.readiness()
    missing, _duplicates = report(
        f"PostgreSQL down {restarted_at - stopped_at:.1f}s", deliveries, total
    )
    assert errors > 0, "the outage was not noticed: the test did not test anything"
    assert missing == 0, f"{missing} requests lost"
    assert all(ready.values()), ready
