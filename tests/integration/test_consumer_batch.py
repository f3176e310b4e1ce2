"""Batch handlers against the real broker: a BatchFailed sends back only the records
it names, through the strategy's own retry path; any other exception, or a
BatchFailed that makes no sense, fails every record of its batch; offsets are
committed past what was dealt with, so a restarted App handles nothing again."""

from __future__ import annotations

import json
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from redrive import App, BatchFailed, Message
from redrive.headers import decode
from tests.integration.consumer_harness import (
    docs_example,
    outcome_count,
    retry_service,
    running_app,
    running_example,
    wait_for,
)
from tests.integration.service_harness import Collector, produce

pytestmark = pytest.mark.integration

POLICY = "1s x3"
BatchHandler = Callable[[list[Message]], None]


class Flaky(Exception):
    pass


@dataclass
class Seen:
    """Every message a batch handler was given, and the batches (thread-safe)."""

    messages: list[Message] = field(default_factory=list)
    batches: list[list[bytes | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, batch: list[Message]) -> None:
        with self.lock:
            self.messages.extend(batch)
            self.batches.append([m.raw_value for m in batch])

    def of(self, value: bytes) -> list[Message]:
        with self.lock:
            return [m for m in self.messages if m.raw_value == value]

    def count(self) -> int:
        with self.lock:
            return len(self.messages)

    def values(self) -> set[bytes | None]:
        with self.lock:
            return {m.raw_value for m in self.messages}


@contextmanager
def batch_app(
    strategy: str,
    bootstrap: str,
    database_url: str,
    topic: str,
    group: str,
    handler: BatchHandler,
    stack: ExitStack,
) -> Iterator[App]:
    requests_topic = "redrive.requests"
    if strategy == "service":
        service = stack.enter_context(
            retry_service(bootstrap, database_url, allowed_destinations=[topic])
        )
        requests_topic = service.settings.requests_topic
    app = App(bootstrap, group=group, requests_topic=requests_topic)
    app.add_batch_handler(
        topic, handler, max_records=40, max_wait=0.3, strategy=strategy, policy=POLICY
    )
    with running_app(app):
        yield app


def values(n: int) -> list[bytes]:
    return [b"v-%03d" % i for i in range(n)]


@pytest.mark.parametrize("strategy", ["topics", "service"])
def test_batch_failed_sends_back_only_the_records_it_names(
    strategy: str, bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(f"batch-{strategy}", partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    failing = {b"v-007", b"v-042", b"v-093"}
    seen = Seen()

    def handler(batch: list[Message]) -> None:
        seen.add(batch)
        failed: list[tuple[int | Message, BaseException]] = []
        for index, message in enumerate(batch):
            if message.raw_value in failing and message.attempt == 1:
                # One by its index, the others by the message itself.
                name = index if message.raw_value == b"v-007" else message
                failed.append((name, Flaky(f"{message.raw_value!r} failed")))
        if failed:
            raise BatchFailed(failed)

    everything = values(100)
    with ExitStack() as stack:
        app = stack.enter_context(
            batch_app(strategy, bootstrap, database_url, topic, group, handler, stack)
        )
        produce(bootstrap, topic, [{"key": v, "value": v} for v in everything])
        assert wait_for(
            lambda: seen.values() >= set(everything) and all(len(seen.of(v)) >= 2 for v in failing),
            60,
        ), f"handled {seen.count()} messages"
        wait_for(lambda: seen.count() > 103, 1.5)  # no more come
        assert wait_for(lambda: outcome_count(app, topic, "handled") == 100, 10)
        assert outcome_count(app, topic, "retried") == 3
        assert outcome_count(app, topic, "dead_lettered") == 0
    for value in everything:
        got = seen.of(value)
        if value not in failing:
            assert [m.attempt for m in got] == [1], value
            continue
        assert [m.attempt for m in got] == [1, 2], value
        first, second = got
        assert second.retry is not None and second.retry.original_offset == first.offset
        assert second.retry.error_type is not None and second.retry.error_type.endswith("Flaky")
        assert second.retry.error_message == f"{value!r} failed"
        assert second.key == value
        # Through the strategy's own path: its tier topic, or back from the service.
        expected = f"{group}.{topic}.retry.1s" if strategy == "topics" else topic
        assert second.topic == expected
    assert max(len(b) for b in seen.batches) > 1, "no batch held more than one record"

    # Restarted: everything was committed, so only a new record is handled.
    again = Seen()
    with ExitStack() as stack:
        stack.enter_context(
            batch_app(strategy, bootstrap, database_url, topic, group, again.add, stack)
        )
        produce(bootstrap, topic, [{"key": b"new", "value": b"new"}])
        assert wait_for(lambda: again.of(b"new") != [], 30)
        wait_for(lambda: again.count() > 1, 1.5)
    assert [m.raw_value for m in again.messages] == [b"new"]


@pytest.mark.parametrize("failure", ["exception", "index out of range"])
def test_a_failing_batch_sends_back_every_record_of_it(
    failure: str, bootstrap: str, new_topic: Callable[..., str], database_url: str
) -> None:
    topic = new_topic("batch-fails")
    group = f"g-{uuid.uuid4().hex[:8]}"
    seen = Seen()
    doomed: list[bytes | None] = []

    def handler(batch: list[Message]) -> None:
        seen.add(batch)
        if any(m.raw_value == b"v-005" and m.attempt == 1 for m in batch):
            doomed.extend(m.raw_value for m in batch)
            if failure == "exception":
                raise RuntimeError("the database is down")
            raise BatchFailed({len(batch) + 5: Flaky("a bug in the handler")})

    everything = values(20)
    with ExitStack() as stack:
        app = stack.enter_context(
            batch_app("topics", bootstrap, database_url, topic, group, handler, stack)
        )
        produce(bootstrap, topic, [{"key": v, "value": v} for v in everything])
        assert wait_for(lambda: seen.values() >= set(everything) and len(doomed) > 0, 30)
        assert wait_for(lambda: all(len(seen.of(v or b"")) >= 2 for v in doomed), 30)
        wait_for(lambda: seen.count() > len(everything) + len(doomed), 1.5)  # no more come
        assert wait_for(lambda: outcome_count(app, topic, "handled") == len(everything), 10)
        assert outcome_count(app, topic, "retried") == len(doomed)
    assert b"v-005" in doomed
    for value in everything:
        attempts = [m.attempt for m in seen.of(value)]
        assert attempts == ([1, 2] if value in doomed else [1]), value
    error_type, says = (
        ("RuntimeError", "the database is down")
        if failure == "exception"
        else ("redrive.consumer.InvalidBatchFailureError", "out of range")
    )
    for value in doomed:
        retry = seen.of(value or b"")[1].retry
        assert retry is not None and retry.error_type == error_type
        assert says in (retry.error_message or "")


def pending_in(app: App, topic: str) -> int:
    """How many records wait in the route's pending batch (white box: the App says
    nothing of it otherwise)."""
    session = app._session
    batches = None if session is None else session.batches
    return 0 if batches is None else len(batches.pending[topic].entries)


def test_a_batch_gathers_records_across_polls_until_max_wait(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("batch-wait")
    seen = Seen()
    app = App(bootstrap, group=f"g-{uuid.uuid4().hex[:8]}")
    app.add_batch_handler(topic, seen.add, max_records=1000, max_wait=5, strategy="topics")
    with running_app(app):
        produce(bootstrap, topic, [{"value": v} for v in values(3)])
        assert wait_for(lambda: pending_in(app, topic) == 3, 20)
        assert seen.batches == []  # its first record has not waited 5 s yet
        produce(bootstrap, topic, [{"value": v} for v in values(5)[3:]])
        assert wait_for(lambda: seen.count() >= 5, 20)
    assert seen.batches == [values(5)]


def test_a_stopping_app_hands_its_pending_batch_over_and_commits_it(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("batch-stop")
    group = f"g-{uuid.uuid4().hex[:8]}"
    seen = Seen()
    app = App(bootstrap, group=group)
    app.add_batch_handler(topic, seen.add, max_wait=600, strategy="topics")
    with running_app(app):
        produce(bootstrap, topic, [{"value": v} for v in values(4)])
        assert wait_for(lambda: pending_in(app, topic) == 4, 20)
        assert seen.batches == []
    assert seen.batches == [values(4)]
    assert outcome_count(app, topic, "handled") == 4

    again = Seen()
    restarted = App(bootstrap, group=group)
    restarted.add_batch_handler(topic, again.add, strategy="topics")
    with running_app(restarted):
        produce(bootstrap, topic, [{"value": b"new"}])
        assert wait_for(lambda: again.of(b"new") != [], 30)
        wait_for(lambda: again.count() > 1, 1.5)
    assert [m.raw_value for m in again.messages] == [b"new"]


def test_the_docs_example_saves_a_batch_and_dead_letters_the_bad_order(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic("batch-docs")
    database = tmp_path / "orders.db"
    source = docs_example(
        "## Batch handlers",
        {
            '"localhost:9092"': repr(bootstrap),
            '"billing"': repr(f"g-{uuid.uuid4().hex[:8]}"),
            '"orders"': repr(topic),
            '"orders.db"': repr(str(database)),
        },
    )
    with running_example(source) as example:
        app: App = example["app"]
        orders = [{"id": "o-1", "total": 10.5}, {"id": "o-2"}, {"id": "o-3", "total": 3.0}]
        produce(
            bootstrap, topic, [{"key": o["id"].encode(), "value": json.dumps(o)} for o in orders]
        )
        assert wait_for(lambda: outcome_count(app, topic, "handled") == 2, 30)
        assert wait_for(lambda: outcome_count(app, topic, "dead_lettered") == 1, 30)
    with closing(sqlite3.connect(database)) as db:
        rows = db.execute("SELECT id, total FROM orders ORDER BY id").fetchall()
    assert rows == [("o-1", 10.5), ("o-3", 3.0)]
    collector = Collector(bootstrap, f"{topic}.dlq")
    [letter] = collector.poll_until(1, 20)
    collector.close()
    request, _ = decode(letter.headers)
    assert letter.key == b"o-2"
    assert request.error_type == "ValueError" and request.error_message == "order o-2 has no total"
    assert request.reason is not None and request.reason.startswith("fatal error")
