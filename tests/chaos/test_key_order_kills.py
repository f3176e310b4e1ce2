"""An async, key-ordered, transactional App SIGKILLed again and again (long mode only:
``make chaos``): each record put behind its key is committed once, and no commit
leaves one uncovered.

The key-order chaos case (tests/chaos/test_key_order.py) kills its App twice a run,
and a restart is when a hand-off can be made twice: a restarted App's first commits
once left out a partition whose first record still ran while they committed the
hand-offs of later records of it, and dropped the names its last commit gave the
records done beyond its position before it read them again. That case caught it once
in eight runs; this one gives it 30 starts a run, each a few hundred milliseconds to
seconds after the last, without the retry service (its keys stay held: most records
go behind), and caught it in two of three runs before the fix. What the group
committed is read back from ``__consumer_offsets`` (`offset_history`): a failure
prints each repeated hand-off with its copies and the commits around them.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.chaos.hand_offs import counted, describe_repeats, read_hand_offs, repeated, uncovered
from tests.chaos.harness import MODE, SEED, AppProcess, now_ms, wait_for
from tests.chaos.offset_history import commits_of

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.integration,
    pytest.mark.timeout(MODE.test_timeout_s),
    pytest.mark.skipif(MODE.name != "long", reason="long mode only (make chaos)"),
]

KILLS = 30
RATE = 300
"""Records a second, in bursts of 5 of one key (the first failing in 30% of bursts)."""
KEYS = 400
SLOW = 0.005
"""The share of records whose handler awaits SLOW_S: a restart often reads one first,
and runs it while the records after it are done and put behind (the moment a commit
must name them with the partition's offsets)."""
SLOW_S = 1.5


def produce_until(bootstrap: str, topic: str, stop: threading.Event, rng: random.Random) -> int:
    """Bursts of one key's records at RATE until ``stop``; how many were acknowledged.
    A failed first record holds its key: the rest of its burst goes behind it."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    acked = 0

    def delivered(err: object, _msg: object) -> None:
        nonlocal acked
        acked += err is None

    sent = 0
    started = time.monotonic()
    while not stop.is_set():
        key = f"k{rng.randrange(KEYS):04d}"
        fails = rng.random() < 0.3
        for seq in range(5):
            roll = rng.random()
            marker = ":f1" if (seq == 0 and fails) or roll < 0.03 else ""
            if not marker and roll > 1 - SLOW:
                marker = ":slow"  # runs for seconds: its partition's position waits at it
            value = f"{key}:{sent:06d}{marker}".encode()
            sent += 1
            while True:
                try:
                    producer.produce(topic, key=key.encode(), value=value, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
        while sent > (time.monotonic() - started) * RATE and not stop.is_set():
            time.sleep(0.01)
    assert producer.flush(60) == 0, "records not acknowledged"
    return acked


def test_records_put_behind_are_committed_once_through_many_kills(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Slow records end within a run's life (0.3 to 2.5 s and its start-up): positions
    # move on, and a run is often killed while one it read first still runs.
    monkeypatch.setenv("REDRIVE_CHAOS_SLOW_S", str(SLOW_S))
    topic = new_topic("chaos-kills", partitions=4)
    group = f"chaos-kills-{uuid.uuid4().hex[:8]}"
    requests = f"requests-{uuid.uuid4().hex[:8]}"
    app = AppProcess(
        bootstrap,
        topic,
        "service",
        group,
        requests,
        tmp_path,
        policy="200ms x3",
        instance_id="kills-0",
        transactional=True,
        ordering="key",
        async_handler=True,
    )
    rng = random.Random(f"{SEED}/key order kills")
    stop = threading.Event()
    acked: list[int] = []
    producer = threading.Thread(
        target=lambda: acked.append(produce_until(bootstrap, topic, stop, rng)), daemon=True
    )
    started_ms = now_ms()
    kills: list[int] = []

    def assigned() -> bool:
        log = tmp_path / f"app-service-{app.runs}.log"
        return '"partitions assigned"' in log.read_text(errors="replace")

    app.start()
    producer.start()
    try:
        for _ in range(KILLS):
            assert wait_for(assigned, 60), app.log_tail()
            time.sleep(rng.uniform(0.3, 2.5))  # soon after its start, or a while
            app.kill()
            kills.append(now_ms())
            time.sleep(rng.uniform(0.0, 1.0))
            app.start()
        stop.set()
        producer.join(90)
        assert wait_for(assigned, 60), app.log_tail()
        time.sleep(3)  # the last run reads what is left, and commits
    finally:
        stop.set()
        code = app.terminate()
    assert code == 0, app.log_tail()
    assert acked and acked[0] > 0
    found = read_hand_offs(bootstrap, requests)
    twice = repeated(counted(found))
    commits = commits_of(bootstrap, group)
    lost = uncovered(found, commits, topic)
    print(
        f"\n[chaos key order kills] mode={MODE.name} seed={SEED}: {len(kills)} kills, "
        f"{acked[0]} records, {len(found)} hand-offs "
        f"({sum(h.kind == 'behind' for h in found)} behind), twice {twice}, "
        f"{len(lost)} uncovered by a later commit",
        flush=True,
    )
    described: list[str] = []
    if twice:
        described = describe_repeats(
            found,
            started_ms=started_ms,
            kills=kills,
            written=read_hand_offs(bootstrap, requests, committed=False),
            commits=commits,
        )
        print(*described, sep="\n", flush=True)
    assert twice == {}, f"hand-offs committed twice: {twice}\n" + "\n".join(described[:3])
    assert not lost, f"{len(lost)} hand-offs a later commit did not cover: {lost[:3]}"
