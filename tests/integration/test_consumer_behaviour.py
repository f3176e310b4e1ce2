"""The consumer library's promises beyond "a failed record comes back": order kept by
the in-place strategies, no rebalance during a long blocking retry, no head-of-line
blocking with the non-blocking ones, at-least-once through rebalances between two
instances (tests/integration/test_consumer_rebalances.py), dead letters for
undeserializable values, hooks, and a committing stop.

Everything runs against the real broker (and PostgreSQL for `service`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from redrive import App, DeserializationError, FatalError, Message
from redrive.headers import decode
from redrive.policy import DeadLetter, DeadLetterReason, Retry
from tests.integration.consumer_harness import (
    Call,
    Calls,
    Flaky,
    Rebalances,
    a_group,
    requests_topic_for,
    running_app,
)
from tests.integration.service_harness import Collector, now_ms, produce

pytestmark = pytest.mark.integration


def by_value(calls: Calls) -> dict[bytes | None, list[Call]]:
    grouped: dict[bytes | None, list[Call]] = {}
    with calls.lock:
        for call in calls.items:
            grouped.setdefault(call.value, []).append(call)
    return grouped


# ------------------------------------------------------------------ 1. order kept


@pytest.mark.parametrize("strategy", ["blocking", "pause"])
def test_in_place_strategies_keep_the_order_of_a_partition(
    strategy: str, bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(f"order-{strategy}", partitions=3)
    values = [f"r{i:02d}".encode() for i in range(20)]
    # How often each record fails (retryably) before it succeeds: 0, 1 or 2 times.
    failures = {v: 2 if i % 5 == 3 else 1 if i % 3 == 1 else 0 for i, v in enumerate(values)}
    assert sum(1 for n in failures.values() if n) >= 8
    calls = Calls()

    def handler(message: Message) -> None:
        calls.add(message)
        if message.attempt <= failures[message.raw_value or b""]:
            raise Flaky(f"{message.raw_value!r} attempt {message.attempt}")

    app = App(bootstrap, group=a_group())
    app.add_handler(topic, handler, policy="300ms x3", strategy=strategy)  # type: ignore[arg-type]

    def successes() -> list[bytes | None]:
        with calls.lock:
            return [c.value for c in calls.items if c.attempt > failures[c.value or b""]]

    with running_app(app):
        produce(bootstrap, topic, [{"key": b"one-key", "value": v} for v in values])
        assert calls.wait_for(lambda: len(successes()) >= len(values), 40), successes()
        calls.wait_for(lambda: len(successes()) > len(values), 1.0)  # no extra handling

    assert successes() == values
    assert len({c.partition for c in calls.items}) == 1
    for value, got in by_value(calls).items():
        assert [c.attempt for c in got] == list(range(1, failures[value or b""] + 2)), value
        for before, after in pairwise(got):
            assert after.at_ms - before.at_ms >= 300, f"{value!r} retried before it was due"


# ------------------------------------------------------------------ 2. long blocking retry


def test_a_blocking_retry_of_three_max_poll_intervals_causes_no_rebalance_nor_duplicate(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    max_poll_ms = 6000
    topic = new_topic("long-blocking", partitions=3)
    calls = Calls()

    def handler(message: Message) -> None:
        calls.add(message)
        if message.raw_value == b"slow" and message.attempt == 1:
            raise Flaky("slow fails once")

    app = App(
        bootstrap,
        group=a_group(),
        kafka={"max.poll.interval.ms": max_poll_ms, "session.timeout.ms": max_poll_ms},
    )
    app.add_handler(topic, handler, policy=f"{3 * max_poll_ms // 1000}s", strategy="blocking")
    # A rebalance (or leaving the group after max.poll.interval.ms) shows as a revoke
    # or a loss of partitions, and a new assignment: record them all on this instance.
    rebalances = Rebalances(app)
    assigned_once = ["assigned [0, 1, 2]"]

    def handled(value: bytes) -> bool:
        return len(calls.of(value)) >= 1

    with running_app(app):
        assert calls.wait_for(lambda: rebalances.seen() == assigned_once, 20)
        produce(bootstrap, topic, [{"key": b"s", "value": b"slow", "partition": 0}])
        assert calls.wait_for(lambda: handled(b"slow"), 20)
        failed_at = calls.of(b"slow")[0].at_ms
        # Behind the failed record on its partition; must wait for it (order).
        produce(bootstrap, topic, [{"key": b"s", "value": b"behind-slow", "partition": 0}])
        early = [f"early-{i}".encode() for i in range(6)]
        produce(
            bootstrap, topic, [{"value": v, "partition": 1 + i % 2} for i, v in enumerate(early)]
        )
        assert calls.wait_for(lambda: all(handled(v) for v in early), 10)
        # Past one max.poll.interval.ms since the failure, other partitions still flow.
        time.sleep(max(0, failed_at + max_poll_ms + 2000 - now_ms()) / 1000)
        late = [f"late-{i}".encode() for i in range(6)]
        produce(
            bootstrap, topic, [{"value": v, "partition": 1 + i % 2} for i, v in enumerate(late)]
        )
        assert calls.wait_for(lambda: all(handled(v) for v in late), 10)
        assert len(calls.of(b"slow")) == 1, "retried before it was due"
        assert calls.wait_for(lambda: len(calls.of(b"slow")) >= 2, 3 * max_poll_ms / 1000 + 10)
        assert calls.wait_for(lambda: handled(b"behind-slow"), 10)
        calls.wait_for(lambda: len(calls.items) > 2 + 1 + len(early) + len(late), 2.0)
        seen_rebalances = rebalances.seen()  # before the stop, whose close revokes

    assert seen_rebalances == assigned_once
    slow = calls.of(b"slow")
    assert [c.attempt for c in slow] == [1, 2]
    assert slow[1].at_ms - slow[0].at_ms >= 3 * max_poll_ms
    for value in [*early, *late]:
        got = calls.of(value)
        assert len(got) == 1 and got[0].at_ms < slow[1].at_ms, value
    assert [c.attempt for c in calls.of(b"behind-slow")] == [1]
    assert calls.of(b"behind-slow")[0].at_ms >= slow[1].at_ms
    assert len(calls.items) == 2 + 1 + len(early) + len(late)


# ------------------------------------------------------------------ 3. no head-of-line blocking


@pytest.mark.parametrize("strategy", ["topics", "service"])
def test_a_failing_record_does_not_hold_back_the_rest_of_its_partition(
    strategy: str, bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(f"hol-{strategy}", partitions=2)
    calls = Calls()

    def handler(message: Message) -> None:
        calls.add(message)
        if message.raw_value == b"first" and message.attempt == 1:
            raise Flaky("first fails once")

    following = [f"next-{i}".encode() for i in range(10)]
    with requests_topic_for(strategy, bootstrap, database_url, topic) as (requests, _):
        app = App(bootstrap, group=a_group(), requests_topic=requests)
        app.add_handler(topic, handler, policy="5s", strategy=strategy)  # type: ignore[arg-type]
        with running_app(app):
            produce(bootstrap, topic, [{"key": b"k", "value": v} for v in [b"first", *following]])
            assert calls.wait_for(lambda: len(calls.of(b"first")) >= 2, 30)
            calls.wait_for(lambda: len(calls.of(b"first")) > 2, 1.0)

    first = calls.of(b"first")
    assert [c.attempt for c in first] == [1, 2]
    assert first[1].at_ms - first[0].at_ms >= 5000, "retried before it was due"
    got = [c for c in calls.items if c.value in following]
    assert [c.value for c in got] == following  # each once, in order
    assert len({c.partition for c in [*first, *got]}) == 1
    for call in got:
        assert call.at_ms - first[0].at_ms <= 2000, f"{call.value!r} was held back"
        assert call.at_ms < first[1].at_ms


# ------------------------------------------------------------------ 5. undeserializable value


def test_an_undeserializable_value_is_a_dead_letter_with_its_raw_bytes(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("json")
    calls = Calls()
    values: list[Any] = []
    hooked: list[tuple[Message | None, DeadLetter, BaseException]] = []

    def handler(message: Message) -> None:
        calls.add(message)
        values.append(message.value)

    app = App(
        bootstrap,
        group=a_group(),
        on_dead_letter=lambda message, dead, error: hooked.append((message, dead, error)),
    )
    app.add_handler(
        topic, handler, policy="300ms x3", strategy="topics", value_deserializer=json.loads
    )
    collector = Collector(bootstrap, f"{topic}.dlq")
    try:
        with running_app(app):
            produce(
                bootstrap,
                topic,
                [
                    {"key": b"bad", "value": b"{not json", "headers": [("trace", b"t-5")]},
                    {"key": b"good", "value": b'{"ok": 1}'},
                ],
            )
            assert calls.wait_for(lambda: len(calls.of(b'{"ok": 1}')) >= 1, 20)
            received = collector.poll_until(1, 20)
            collector.drain(1.5)
            calls.wait_for(lambda: len(calls.items) > 1, 0.5)
    finally:
        collector.close()

    assert values == [{"ok": 1}]  # the handler never saw the bad record
    assert len(received) == 1
    letter = received[0]
    assert letter.key == b"bad" and letter.value == b"{not json"
    request, users = decode(letter.headers)
    assert users == [("trace", b"t-5")]
    assert request.send_to == "dlq"
    assert request.original_topic == topic and request.original_offset == 0
    assert request.attempt == 1
    assert "deserializ" in (request.reason or "")
    assert (request.error_type or "").endswith("DeserializationError")
    assert len(hooked) == 1
    message, dead, error = hooked[0]
    assert message is None
    assert dead.reason is DeadLetterReason.FATAL_ERROR and "deserializ" in dead.text
    assert isinstance(error, DeserializationError)
    assert isinstance(error.__cause__, json.JSONDecodeError)


# ------------------------------------------------------------------ 6. hooks


@pytest.mark.parametrize("strategy", ["blocking", "pause", "topics", "service"])
def test_hooks_see_message_and_decision_and_a_raising_hook_does_not_break_the_loop(
    strategy: str, bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(f"hooks-{strategy}")
    calls = Calls()
    retries: list[tuple[Message, Retry, BaseException]] = []
    deads: list[tuple[Message | None, DeadLetter, BaseException]] = []

    def on_retry(message: Message, decision: Retry, error: BaseException) -> None:
        retries.append((message, decision, error))
        raise RuntimeError("on_retry hook is broken")

    def on_dead_letter(message: Message | None, decision: DeadLetter, error: BaseException) -> None:
        deads.append((message, decision, error))
        raise RuntimeError("on_dead_letter hook is broken")

    def handler(message: Message) -> None:
        calls.add(message)
        if message.raw_value == b"doomed":
            raise Flaky("never works")
        if message.raw_value == b"poison":
            raise FatalError("cannot ever work")

    with requests_topic_for(strategy, bootstrap, database_url, topic) as (requests, _):
        app = App(
            bootstrap,
            group=a_group(),
            requests_topic=requests,
            on_retry=on_retry,
            on_dead_letter=on_dead_letter,
        )
        app.add_handler(topic, handler, policy="300ms", strategy=strategy)  # type: ignore[arg-type]
        with running_app(app):
            produce(
                bootstrap,
                topic,
                [{"key": b"k", "value": v} for v in (b"doomed", b"poison", b"fine")],
            )
            assert calls.wait_for(lambda: len(deads) >= 2 and len(calls.of(b"fine")) == 1, 30)
            produce(bootstrap, topic, [{"key": b"k", "value": b"later"}])
            assert calls.wait_for(lambda: len(calls.of(b"later")) == 1, 20)
            calls.wait_for(lambda: len(deads) > 2 or len(retries) > 1, 1.0)
            assert app.running.is_set()

    assert [c.attempt for c in calls.of(b"doomed")] == [1, 2]
    assert [c.attempt for c in calls.of(b"poison")] == [1]
    assert len(retries) == 1
    message, retry, error = retries[0]
    assert message.raw_value == b"doomed" and message.attempt == 1 and message.topic == topic
    assert isinstance(retry, Retry) and retry.attempt == 1 and retry.delay_ms == 300
    assert isinstance(error, Flaky)
    assert len(deads) == 2
    dead_of = {m.raw_value if m else None: (m, d, e) for m, d, e in deads}
    doomed, spent, doomed_error = dead_of[b"doomed"]
    assert doomed is not None and doomed.attempt == 2
    assert isinstance(spent, DeadLetter) and spent.reason is DeadLetterReason.ATTEMPTS_EXHAUSTED
    assert isinstance(doomed_error, Flaky)
    poison, fatal, poison_error = dead_of[b"poison"]
    assert poison is not None and poison.attempt == 1
    assert isinstance(fatal, DeadLetter) and fatal.reason is DeadLetterReason.FATAL_ERROR
    assert isinstance(poison_error, FatalError)


# ------------------------------------------------------------------ 7. graceful stop


def test_a_graceful_stop_commits_so_the_next_instance_gets_nothing_again(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("stop", partitions=3)
    group = a_group()
    values = [f"s{i:02d}".encode() for i in range(50)]
    first, second = Calls(), Calls()
    # No periodic commit during the test: only the stop can commit.
    app = App(bootstrap, group=group, commit_interval_s=3600)
    app.add_handler(topic, first.add, strategy="blocking")
    with running_app(app):
        produce(bootstrap, topic, [{"key": v, "value": v} for v in values])
        assert first.wait_for(lambda: len(first.items) >= len(values), 20)
    assert not app.running.is_set()
    assert sorted(c.value or b"" for c in first.items) == values
    assert len({c.partition for c in first.items}) > 1

    again = App(bootstrap, group=group)
    again.add_handler(topic, second.add, strategy="blocking")
    with running_app(again):
        produce(bootstrap, topic, [{"key": b"after", "value": b"after"}])
        assert second.wait_for(lambda: len(second.of(b"after")) == 1, 20)
        second.wait_for(lambda: len(second.items) > 1, 1.5)
    assert [c.value for c in second.items] == [b"after"]


def test_consumer_kafka_settings_reach_the_consumer_but_never_its_group(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("settings", partitions=1)
    group = a_group()
    calls = Calls()
    # A consumer-only tuning (the producer would warn about it) and an attempt to move
    # the app to another group, which redrive's guarantees do not allow.
    app = App(
        bootstrap,
        group=group,
        consumer_kafka={"fetch.min.bytes": 65_536, "fetch.wait.max.ms": 20, "group.id": "other"},
    )
    app.add_handler(topic, calls.add, strategy="blocking")
    with running_app(app):
        produce(bootstrap, topic, [{"key": b"k", "value": b"v"}])
        assert calls.wait_for(lambda: len(calls.items) == 1, 20)
    committed = _committed(bootstrap, group, topic)
    assert committed == 1, "the app consumed and committed as its own group"
    assert _committed(bootstrap, "other", topic) is None


def _committed(bootstrap: str, group: str, topic: str) -> int | None:
    from confluent_kafka import Consumer

    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        [tp] = probe.committed([TopicPartition(topic, 0)], timeout=10)
        return tp.offset if tp.offset >= 0 else None
    finally:
        probe.close()
