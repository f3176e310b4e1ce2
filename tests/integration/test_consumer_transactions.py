"""The exactly-once hand-off against the real broker: with ``App(transactional=True)``
the retry records and the source offsets are one transaction, so an App SIGKILLed in
the middle of retries, and restarted, hands each failure off exactly once (its
handler may run again: that part stays at least once), and loses nothing."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from redrive import App, Message
from tests.chaos.hand_offs import counted, read_hand_offs, repeated
from tests.chaos.harness import AppProcess
from tests.integration.consumer_harness import Calls, running_app, wait_for
from tests.integration.service_harness import Collector, produce

pytestmark = pytest.mark.integration


class Flaky(Exception):
    pass


def tier_records(bootstrap: str, tier: str, expected: int) -> Counter[bytes]:
    """How many times each value was written to the tier topic and committed (the
    collector reads committed records only: librdkafka's default isolation level)."""
    collector = Collector(bootstrap, tier)
    try:
        collector.poll_until(expected, 30)
        received = collector.drain(1.5)
    finally:
        collector.close()
    return Counter(d.value for d in received if d.value is not None)


def test_a_transactional_app_hands_each_failure_off_once(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("txn", partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    values = [b"v-%03d" % i for i in range(200)]
    failing = set(values[::10])
    calls = Calls()

    def handler(message: Message) -> None:
        calls.add(message)
        if message.raw_value in failing and message.attempt == 1:
            raise Flaky("first attempt")

    app = App(bootstrap, group=group, transactional=True)
    app.add_handler(topic, handler, strategy="topics", policy="200ms x3")
    with running_app(app):
        produce(bootstrap, topic, [{"key": v, "value": v} for v in values])
        done = lambda: all(any(c.attempt == 2 for c in calls.of(v)) for v in failing)  # noqa: E731
        assert wait_for(done, 60)
        assert wait_for(lambda: len(calls.items) >= 220, 10)
    assert sorted(c.value for c in calls.items if c.value not in failing) == sorted(
        set(values) - failing
    )
    assert tier_records(bootstrap, f"{group}.{topic}.retry.200ms", 20) == Counter(
        dict.fromkeys(failing, 1)
    )
    # Restarted: the offsets were committed in the transactions; nothing comes again.
    again = Calls()
    restarted = App(bootstrap, group=group, transactional=True)
    restarted.add_handler(topic, again.add, strategy="topics", policy="200ms x3")
    with running_app(restarted):
        produce(bootstrap, topic, [{"key": b"new", "value": b"new"}])
        assert wait_for(lambda: again.of(b"new") != [], 30)
        wait_for(lambda: len(again.items) > 1, 1.5)
    assert [c.value for c in again.items] == [b"new"]


def test_a_due_retry_does_not_wait_for_the_commit_interval(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """A tier record is read once the transaction that wrote it commits: the App
    commits as soon as a hand-off it holds is due, not at its commit interval."""
    topic = new_topic("txn-due")
    calls = Calls()

    def handler(message: Message) -> None:
        calls.add(message)
        if message.attempt == 1:
            raise Flaky("first attempt")

    app = App(
        bootstrap, group=f"g-{uuid.uuid4().hex[:8]}", transactional=True, commit_interval_s=120
    )
    app.add_handler(topic, handler, strategy="topics", policy="200ms x3")
    with running_app(app):
        produce(bootstrap, topic, [{"key": b"k", "value": b"v"}])
        # Well inside the interval: its retry came back before any interval commit.
        assert wait_for(lambda: any(c.attempt == 2 for c in calls.of(b"v")), 60)
    assert [c.attempt for c in calls.of(b"v")] == [1, 2]


def test_an_app_killed_mid_retry_hands_each_failure_off_exactly_once(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic("txn-kill", partitions=3)
    group = f"g-{uuid.uuid4().hex[:8]}"
    values = [f"m-{i:04d}:f1" for i in range(600)]  # each fails once, then succeeds
    app = AppProcess(
        bootstrap,
        topic,
        "topics",
        group,
        "redrive.requests",
        tmp_path,
        policy="300ms x4",
        # Static: the restarted run aborts what the killed one left open at once.
        instance_id="txn-0",
        transactional=True,
    )
    app.start()
    kills = 0
    try:
        for chunk in range(3):
            produce(
                bootstrap,
                topic,
                [{"key": v.encode(), "value": v.encode()} for v in values[chunk * 200 :][:200]],
            )
            if chunk == 2:
                break
            # In the middle of retries: failed records not handled since.
            assert wait_for(lambda: len(app.in_retry()) >= 5, 60), app.log_tail()
            time.sleep(0.2)
            app.kill()
            kills += 1
            app.start()
        sent = {v.encode() for v in values}
        assert wait_for(lambda: sent <= app.handled().keys(), 120), app.log_tail()
        assert app.alive(), app.log_tail()
    finally:
        code = app.terminate()
    assert code == 0, app.log_tail()
    assert kills == 2
    handed = tier_records(bootstrap, f"{group}.{topic}.retry.300ms", len(values))
    twice = {v: n for v, n in handed.items() if n > 1}
    assert twice == {}, f"{len(twice)} failures handed off more than once"
    assert set(handed) == {v.encode() for v in values}, "a failure was never handed off"
    assert app.early() == 0


def test_an_async_app_killed_while_its_first_record_runs_puts_nothing_behind_twice(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """The moment the key-order chaos case hit once in eight runs, made to happen: a
    restarted async App's first record of a partition still runs (`:slow`) while the
    later records of a held key are put behind, and a commit makes those hand-offs
    visible; the App is killed before that record ends. The commit must have carried
    the partition's offsets naming the records put behind (a partition has a position
    from its first record read, not from its first record done): the next run skips
    them instead of putting them behind a second time."""
    topic = new_topic("txn-first")
    group = f"g-{uuid.uuid4().hex[:8]}"
    requests = f"requests-{uuid.uuid4().hex[:8]}"
    app = AppProcess(
        bootstrap,
        topic,
        "service",
        group,
        requests,
        tmp_path,
        policy="200ms x3",
        instance_id="txn-first-0",
        transactional=True,
        ordering="key",
        async_handler=True,
    )

    def log_of_run() -> str:
        return (tmp_path / f"app-service-{app.runs}.log").read_text(errors="replace")

    def behind() -> int:
        return sum(h.kind == "behind" for h in read_hand_offs(bootstrap, requests))

    app.start()
    try:
        # Run 1: key a's record fails (its retry to the service, which is not running):
        # key a is held. A clean stop commits past it.
        produce(bootstrap, topic, [{"key": b"a", "value": b"a:00:f1"}])
        assert wait_for(lambda: '"handler failed"' in log_of_run(), 60), app.log_tail()
        assert app.terminate() == 0, app.log_tail()
        # Run 2 reads from there: the slow record first, then three of key a.
        produce(
            bootstrap,
            topic,
            [{"key": b"s", "value": b"s:01:slow"}]
            + [{"key": b"a", "value": f"a:{seq:02d}".encode()} for seq in (2, 3, 4)],
        )
        app.start()
        assert wait_for(lambda: behind() == 3, 60), app.log_tail()  # committed
        assert "s:01:slow" not in {e["value"] for e in app.events()}, "it ended already"
        app.kill()
        # Run 3: from the committed position, the slow record again and then key a's.
        app.start()
        assert wait_for(
            lambda: (
                log_of_run().count("record dealt with before skipped")
                + log_of_run().count("record waits behind its key's retry")
                >= 3
            ),
            60,
        ), app.log_tail()
    finally:
        code = app.terminate()
    assert code == 0, app.log_tail()
    twice = repeated(counted(read_hand_offs(bootstrap, requests)))
    assert twice == {}, f"put behind again after the kill: {twice}"
    assert behind() == 3
