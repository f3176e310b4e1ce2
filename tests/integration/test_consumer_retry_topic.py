"""The ``retry-topic`` strategy (seed 000's single retry topic) against the real broker:
a retry comes back on ``<group>.<topic>.retry.all`` never early while its source
partition flows; a record past its maximum duration from its own timestamp is a dead
letter saying so; another group never sees the retries; the docs example runs."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from itertools import pairwise

import pytest

from redrive import App, Message
from redrive.headers import decode
from tests.integration.consumer_harness import (
    Calls,
    docs_example,
    running_app,
    running_example,
    wait_for,
)
from tests.integration.service_harness import Collector, now_ms, produce

pytestmark = pytest.mark.integration


class Flaky(Exception):
    pass


def a_group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def test_a_retry_comes_back_on_the_retry_topic_never_early_while_its_partition_flows(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("retry-topic", partitions=1)
    group = a_group()
    calls = Calls()
    failed = threading.Event()

    def handler(message: Message) -> None:
        calls.add(message)
        if message.raw_value == b"fails-once" and message.attempt == 1:
            failed.set()
            raise Flaky("not yet")

    app = App(bootstrap, group=group)
    app.add_handler(topic, handler, policy="2s", strategy="retry-topic")
    assert app.routes[topic].tiers == {2_000: f"{group}.{topic}.retry.all"}
    with running_app(app):
        produce(bootstrap, topic, [{"key": b"k", "value": b"fails-once"}])
        assert failed.wait(30)
        produce(bootstrap, topic, [{"key": b"k", "value": b"after-%d" % i} for i in range(3)])
        assert calls.wait_for(lambda: len(calls.of(b"fails-once")) >= 2, 15)
        calls.wait_for(lambda: len(calls.of(b"fails-once")) > 2, 1.0)  # no third call
    first, retry = calls.of(b"fails-once")
    assert (first.attempt, first.topic) == (1, topic)
    assert (retry.attempt, retry.topic) == (2, f"{group}.{topic}.retry.all")
    assert retry.partition == first.partition == 0 and retry.key == b"k"
    assert retry.at_ms >= first.at_ms + 2_000, f"back {retry.at_ms - first.at_ms} ms after"
    assert retry.at_ms < first.at_ms + 6_000  # and not forgotten
    later = [calls.of(b"after-%d" % i) for i in range(3)]
    assert [len(c) for c in later] == [1, 1, 1]
    assert all(c[0].partition == 0 and c[0].at_ms < retry.at_ms for c in later), (
        "the source partition waited for the retry"
    )


def test_past_its_max_duration_from_the_record_timestamp_a_record_is_a_dead_letter(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("retry-topic-deadline")
    calls = Calls()

    def handler(message: Message) -> None:
        calls.add(message)
        if message.raw_value != b"warm-up":
            raise Flaky("the item does not exist")

    group = a_group()
    app = App(bootstrap, group=group)
    app.add_handler(
        topic,
        handler,
        policy="1s x*",
        max_duration="3s",
        deadline_from="record-timestamp",
        strategy="retry-topic",
    )
    with running_app(app):
        produce(bootstrap, topic, [{"value": b"warm-up"}])  # the app is assigned and reading
        assert calls.wait_for(lambda: calls.of(b"warm-up") != [], 30)
        stamp = now_ms()
        produce(
            bootstrap,
            topic,
            [
                {"key": b"new", "value": b"new", "timestamp": stamp},
                {"key": b"old", "value": b"old", "timestamp": stamp - 10_000},
            ],
        )
        collector = Collector(bootstrap, f"{topic}.dlq")
        try:
            letters = collector.poll_until(2, 20)
            collector.drain(1.0)
        finally:
            collector.close()
    assert sorted(letter.key or b"" for letter in letters) == [b"new", b"old"]
    assert [c.attempt for c in calls.of(b"warm-up")] == [1]
    by_key = {letter.key: decode(letter.headers)[0] for letter in letters}

    new = by_key[b"new"]
    tries = calls.of(b"new")
    attempts = [c.attempt for c in tries]
    assert attempts == list(range(1, len(attempts) + 1)), attempts
    # Retried a second later each time for as long as that was before the deadline (a
    # loaded machine gets fewer tries in, never one past it), then given up on.
    deadline = stamp + 3_000
    assert all(after.at_ms >= before.at_ms + 1_000 for before, after in pairwise(tries))
    assert all(before.at_ms + 1_000 <= deadline for before, _ in pairwise(tries))
    assert len(tries) >= 2 or tries[0].at_ms + 1_000 > deadline, attempts
    assert {c.topic for c in calls.of(b"new")[1:]} == {f"{group}.{topic}.retry.all"}
    assert new.send_to == "dlq" and new.attempt == len(attempts) and new.original_topic == topic
    assert new.reason is not None and new.reason.startswith("max duration 3s exceeded: ")
    assert new.deadline == stamp + 3_000  # counted from the record's timestamp

    old = by_key[b"old"]
    assert [c.attempt for c in calls.of(b"old")] == [1]  # failed once, never retried
    assert old.send_to == "dlq" and old.attempt == 1 and old.original_topic == topic
    assert old.reason is not None and old.reason.startswith("max duration 3s exceeded: failed ")
    assert "after the deadline" in old.reason


def test_another_group_never_sees_the_retries(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("retry-topic-groups", partitions=2)
    seen = {"a": Calls(), "b": Calls()}

    def handler_of(name: str) -> Callable[[Message], None]:
        def handler(message: Message) -> None:
            seen[name].add(message)
            if message.raw_value == b"fails-in-" + name.encode() and message.attempt == 1:
                raise Flaky("once")

        return handler

    values = [b"fails-in-a", b"fails-in-b", b"ok-1", b"ok-2"]
    with ExitStack() as stack:
        apps = {}
        for name in seen:
            apps[name] = App(bootstrap, group=a_group())
            apps[name].add_handler(topic, handler_of(name), policy="1s", strategy="retry-topic")
            stack.enter_context(running_app(apps[name]))
        produce(bootstrap, topic, [{"key": v, "value": v} for v in values])
        for name, calls in seen.items():
            mine = b"fails-in-" + name.encode()
            assert wait_for(lambda: len(calls.of(mine)) >= 2, 20), f"{name}: no retry"  # noqa: B023
        wait_for(lambda: any(len(c.items) > len(values) + 1 for c in seen.values()), 1.5)
    for name, calls in seen.items():  # each value once, but this group's own retry
        retried = b"fails-in-" + name.encode()
        attempts = {value: [c.attempt for c in calls.of(value)] for value in values}
        assert attempts == {v: [1, 2] if v == retried else [1] for v in values}, name
    for name, calls in seen.items():
        retry_topic = f"{apps[name].group}.{topic}.retry.all"
        assert calls.of(b"fails-in-" + name.encode())[1].topic == retry_topic


def test_the_docs_example_applies_an_update_that_came_before_its_create(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    creates, updates, group = new_topic("create-item"), new_topic("update-item"), a_group()
    source = docs_example(
        "### Seed 000's single retry topic",
        {
            '"localhost:9092"': repr(bootstrap),
            '"items"': repr(group),
            '"create-item"': repr(creates),
            '"update-item"': repr(updates),
            'policy="10s x*"': 'policy="1s x*"',  # the test's patience
        },
    )
    with running_example(source) as example:
        app: App = example["app"]
        retry_topic = f"{group}.{updates}.retry.all"
        assert app.routes[updates].tiers == {1_000: retry_topic}
        assert app.routes[updates].policy.deadline_from == "record-timestamp"
        produce(bootstrap, updates, [{"key": b"item-1", "value": b"ACTIVE"}])
        collector = Collector(bootstrap, retry_topic)
        try:
            assert len(collector.poll_until(1, 20)) == 1  # failed: the item is not created
        finally:
            collector.close()
        produce(bootstrap, creates, [{"key": b"item-1", "value": b"{}"}])
        items = example["items"]
        assert wait_for(lambda: items.get("item-1") == "ACTIVE", 20), items
