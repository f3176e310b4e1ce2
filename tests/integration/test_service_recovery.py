"""A `redrive serve` process SIGKILLed and restarted at once is delivering again in
seconds, not after the broker's session timeout.

A restarted intake is a new member of its consumer group. Without static membership
the broker hands it the partitions only once it has given up on the killed member
(`session.timeout.ms`, 45 s by default), and every request arriving meanwhile waits.
With a stable `group.instance.id` (the `instance_id` setting, by default derived from
the host name and the fixed HTTP port) the restarted process takes the killed one's
place at once. This test runs with the broker's default session timeout on purpose.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from redrive.deadlines import Deadline
from redrive.ports import free_port
from tests.integration.service_harness import (
    Collector,
    Delivery,
    Load,
    Record,
    ServiceProcess,
    fresh_database,
    now_ms,
    pending_count,
    produce,
    request_headers,
    settings_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

UPFRONT = 2_000  # stored before the first kill, due over the next 3 to 15 s
STREAM_RATE = 150  # requests a second, each due 0.3 to 2 s after it is made
STREAM_S = 14.0
KILLS_AT_S = (4.0, 9.0)  # after the stream started; each restart follows at once
SESSION_TIMEOUT_MS = 45_000  # the broker's default, which the test keeps
P99_BOUND_MS = SESSION_TIMEOUT_MS // 2
"""What tells a restart that took its partitions back at once (static membership)
from one that waited for the killed member's session to time out: the retries due
meanwhile would be late by up to the session timeout. Not a speed goal: a loaded
machine slows a restart (a few seconds on a quiet one, see the printed figures)."""


def due_of(delivery: Delivery) -> int:
    raw = delivery.header("redrive-retry-at")
    assert raw is not None
    return int(raw)


def percentile(sorted_values: list[int], fraction: float) -> int:
    if not sorted_values:
        return 0
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


def test_a_service_sigkilled_and_restarted_delivers_again_within_seconds(
    bootstrap: str, database_url: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    destination = new_topic("recovery", partitions=3)
    db = fresh_database(database_url)
    # A fixed HTTP port, as in production: the default instance_id is derived from it.
    # The broker's default session timeout (45 s) is kept: it is what the test is about.
    settings = settings_for(
        bootstrap, db, allowed_destinations=[destination], http_port=free_port()
    )
    rng = random.Random(14)
    upfront_due = now_ms() + 3_000
    upfront = [
        {
            "key": f"k{i % 31}".encode(),
            "value": f"upfront-{i:05d}".encode(),
            "headers": request_headers(destination, upfront_due + rng.randrange(12_000)),
        }
        for i in range(UPFRONT)
    ]

    def streamed(i: int) -> Record:
        return {
            "key": f"k{i % 31}".encode(),
            "value": f"stream-{i:05d}".encode(),
            "headers": request_headers(destination, now_ms() + rng.randrange(300, 2_000)),
        }

    collector = Collector(bootstrap, destination)
    deadline = Deadline(30)
    while not collector.consumer.assignment():  # listening before anything is due
        assert not deadline.passed(), "the collector was never assigned its partitions"
        collector.poll_until(1, 0.1)

    def pump() -> None:
        collector.poll_until(sys.maxsize, 0.1)

    instances = [ServiceProcess(settings, tmp_path / "serve-1.log")]
    load = Load(bootstrap, settings.requests_topic, STREAM_RATE, streamed, name="stream")
    first_kill_ms = 0
    restarts: list[float] = []
    try:
        instances[0].start()
        produce(bootstrap, settings.requests_topic, upfront)
        deadline = Deadline(60)
        while pending_count(db) + len(collector.received) < UPFRONT:  # stored: intake works
            assert not deadline.passed(), "intake did not store the first requests"
            pump()
        load.start()
        for at in KILLS_AT_S:
            while time.monotonic() - load.started < at:
                pump()
            first_kill_ms = first_kill_ms or now_ms()
            killed = time.monotonic()
            instances[-1].kill()
            instances.append(ServiceProcess(settings, tmp_path / f"serve-{len(instances) + 1}.log"))
            # Collect while it starts: a delivery is timed when the collector reads it.
            with ThreadPoolExecutor(1) as pool:
                started = pool.submit(instances[-1].start)
                while not started.done():
                    pump()
                started.result()
            restarts.append(time.monotonic() - killed)
        while time.monotonic() - load.started < STREAM_S:
            pump()
        sent = load.finish() | {r["value"] for r in upfront}
        deadline = Deadline(120)
        while not sent <= {d.value for d in collector.received}:
            assert not deadline.passed(), (
                f"not every request was delivered in {deadline.describe()}"
            )
            pump()
        collector.drain(quiet_s=2)
    finally:
        load.stop()
        code = instances[-1].terminate() if instances[-1].proc is not None else None
        collector.close()

    deliveries = collector.received
    counts = Counter(d.value for d in deliveries)
    duplicates = sum(c - 1 for c in counts.values())
    missing = len(sent - counts.keys())
    early = [d for d in deliveries if d.received_ms < due_of(d)]
    after = sorted(d.received_ms - due_of(d) for d in deliveries if d.received_ms >= first_kill_ms)
    overall = sorted(d.received_ms - due_of(d) for d in deliveries)
    print(
        f"\n[recovery] {len(sent)} requests, {len(KILLS_AT_S)} SIGKILLs, restarts took "
        f"{', '.join(f'{s:.1f}s' for s in restarts)}; delivered {len(counts)} unique, "
        f"{duplicates} duplicates, {missing} missing, {len(early)} early; lateness ms after "
        f"the first kill ({len(after)} deliveries): p50={statistics.median(after or [0]):.0f} "
        f"p99={percentile(after, 0.99)} max={max(after, default=0)}; overall: "
        f"p50={statistics.median(overall or [0]):.0f} p99={percentile(overall, 0.99)} "
        f"max={max(overall, default=0)}"
    )
    assert missing == 0, f"{missing} requests lost"
    assert not early, f"{len(early)} retries arrived before they were due"
    assert code == 0
    assert pending_count(db) == 0
    assert percentile(after, 0.99) < P99_BOUND_MS, (
        f"after a restart, lateness p99 {percentile(after, 0.99)} ms: the restarted instance "
        "waited for its partitions"
    )


def test_two_instances_sharing_an_instance_id_stop_the_older_naming_the_setting(
    bootstrap: str, database_url: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    # The broker lets one live member hold an instance id: the one that joins last
    # fences the other out of the group, which must not go on idling in silence.
    destination = new_topic("fenced")
    db = fresh_database(database_url)
    settings = settings_for(
        bootstrap, db, allowed_destinations=[destination], instance_id="shared-id"
    )
    collector = Collector(bootstrap, destination)
    older = ServiceProcess(settings, tmp_path / "older.log")
    newer = ServiceProcess(settings, tmp_path / "newer.log")

    def deliver(value: bytes) -> None:
        headers = request_headers(destination, now_ms() + 100)
        produce(bootstrap, settings.requests_topic, [{"value": value, "headers": headers}])
        wanted = len(collector.received) + 1
        assert [d.value for d in collector.poll_until(wanted, 60)][-1:] == [value]

    try:
        older.start()
        deliver(b"through the older")  # its intake is a member of the group
        newer.start()
        assert older.proc is not None
        code = older.proc.wait(60)
        deliver(b"through the newer")
    finally:
        collector.close()
        newer_code = newer.terminate() if newer.proc is not None else None
        if older.proc is not None:
            older.terminate()
    log = older.log_path.read_text()
    assert code == 2, log[-3000:]
    assert "redrive: instance_id (REDRIVE_INSTANCE_ID): another instance joined" in log
    assert "'shared-id'" in log and "fix: give each instance its own id" in log
    assert "Traceback" not in log
    assert newer_code == 0
