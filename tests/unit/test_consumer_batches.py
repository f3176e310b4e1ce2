"""Batch handlers without a broker: what a BatchFailed may name, what the settings
accept, how a pending batch is cut, and that a failed record of a batch becomes the
retry a single-record handler raising its error would have made."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Message as KafkaMessage

from redrive import App, BatchFailed, Message, Service, Topics
from redrive.consumer import AsyncHandlerError, InvalidBatchFailureError
from redrive.consumer.batches import (
    Batches,
    BatchSettings,
    Entry,
    Pending,
    batch_settings,
    failures_of,
    resolve,
)
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.outcomes import Outcomes
from redrive.consumer.pipeline import Pipeline
from redrive.consumer.repeats import RecentIds
from redrive.consumer.routes import Route, build_route
from redrive.consumer.settings import Hooks
from redrive.consumer.steps import KeyOrders, build_steps
from redrive.consumer.strategies.pause import Breakers
from redrive.errors import ConfigError
from redrive.headers import decode, encode
from redrive.router import Router

pytestmark = pytest.mark.unit

GROUP = "billing"
NOW = 1_700_000_000_000


def message(offset: int, topic: str = "orders", partition: int = 0) -> Message:
    return Message(topic, partition, offset, b"k", b"v", b"v", [], None, 1, None)


BATCH = [message(10), message(11), message(12, partition=1)]


# ---------------------------------------------------------------------- resolve


def test_failures_are_named_by_index_or_by_message() -> None:
    first, error_a, error_b = BATCH[0], ValueError("a"), KeyError("b")
    assert resolve(BatchFailed({2: error_a}), BATCH) == {2: error_a}
    assert resolve(BatchFailed([(first, error_a), (1, error_b)]), BATCH) == {
        0: error_a,
        1: error_b,
    }
    copy = dataclasses.replace(BATCH[2])  # not the same object: found by its place
    assert resolve(BatchFailed([(copy, error_b)]), BATCH) == {2: error_b}


@pytest.mark.parametrize(
    ("failures", "says"),
    [
        ({}, "naming no record"),
        ({3: ValueError()}, "index 3, out of range: the batch has 3 record(s), indices 0 to 2"),
        ({-1: ValueError()}, "index -1, out of range"),
        ({True: ValueError()}, "name a record by its index"),
        ({"0": ValueError()}, "name a record by its index"),
        ([(message(99), ValueError())], "orders[0]@99, which is not in this batch"),
        ({0: "broken"}, "which is not an exception"),
        ([(0, ValueError()), (BATCH[0], ValueError())], "names record 0 twice"),
        ([(0,)], "pairs"),
        ([5], "pairs"),
    ],
)
def test_a_batch_failed_that_makes_no_sense_is_refused(failures: Any, says: str) -> None:
    with pytest.raises(InvalidBatchFailureError) as caught:
        resolve(BatchFailed(failures), BATCH)
    assert says in str(caught.value)


def test_an_invalid_batch_failed_fails_every_record_of_the_batch() -> None:
    failed = BatchFailed({7: ValueError("x")})
    failures = failures_of(failed, BATCH)
    assert sorted(failures) == [0, 1, 2]
    errors = set(map(id, failures.values()))
    assert len(errors) == 1
    error = failures[0]
    assert isinstance(error, InvalidBatchFailureError) and error.__cause__ is failed
    assert "index 7, out of range" in str(error)


# ---------------------------------------------------------------------- settings


@pytest.mark.parametrize("strategy", ["blocking", "pause"])
def test_strategies_that_retry_in_place_are_refused(strategy: str) -> None:
    app = App("localhost:1", group=GROUP)
    with pytest.raises(
        ConfigError, match=f"do not support '{strategy}' yet: it retries in place"
    ) as caught:
        app.add_batch_handler("orders", lambda batch: None, strategy=strategy)
    assert "use strategy 'topics' or 'retry-topic' or 'service'" in str(caught.value)
    assert app.routes == {}


def test_an_unknown_strategy_is_refused_as_for_any_handler() -> None:
    app = App("localhost:1", group=GROUP)
    with pytest.raises(ConfigError, match="'sometimes' is not a strategy"):
        app.add_batch_handler("orders", lambda batch: None, strategy="sometimes")
    assert app.routes == {}


@pytest.mark.parametrize(
    ("max_records", "max_wait", "setting"),
    [
        (0, 0, "max_records"),
        (True, 0, "max_records"),
        ("10", 0, "max_records"),
        (10, -1, "max_wait"),
        (10, "soon", "max_wait"),
        (10, None, "max_wait"),
    ],
)
def test_bad_batch_settings_are_refused(max_records: Any, max_wait: Any, setting: str) -> None:
    with pytest.raises(ConfigError, match=f"^{setting} for batch handler 'orders'"):
        batch_settings("orders", print, Topics(), max_records, max_wait)


def test_max_wait_takes_seconds_or_a_duration() -> None:
    assert batch_settings("orders", print, Service(), 5, "250ms") == BatchSettings(5, 0.25)
    assert batch_settings("orders", print, Topics(), 5, 2) == BatchSettings(5, 2.0)


def test_an_async_batch_handler_is_refused_at_registration() -> None:
    app = App("localhost:1", group=GROUP)

    async def handle(batch: list[Message]) -> None:
        raise AssertionError("never run")

    with pytest.raises(ConfigError, match="async batch handlers are not supported yet"):
        app.batch_handler("orders", strategy="topics")(handle)
    assert app.routes == {}


def test_the_decorator_registers_a_batch_route() -> None:
    app = App("localhost:1", group=GROUP)

    @app.batch_handler("orders", max_records=50, max_wait=0.5, strategy="topics", policy="1s")
    def handle(batch: list[Message]) -> None:
        pass

    assert app.routes["orders"].handler is handle
    with pytest.raises(ConfigError, match="registered twice"):
        app.add_batch_handler("orders", handle, strategy="topics")
    with pytest.raises(TypeError, match="unknown handler option"):
        app.add_batch_handler("other", handle, strategy="topics", colour="red")


# ---------------------------------------------------------------------- pending batches


class FakePublisher:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, topic: str, **fields: Any) -> None:
        self.sent.append({"topic": topic, **fields})


def records_for(
    handler: Callable[..., Any], strategy: str = "topics"
) -> tuple[Pipeline, Route, FakePublisher]:
    route = build_route("orders", handler, GROUP, {"strategy": strategy, "policy": "1s"}, "1s")
    route.router = Router(route.policy, GROUP, clock=lambda: NOW)
    reads = {name: (route, kind) for name, kind in route.topics().items()}
    publisher = FakePublisher()
    outcomes = Outcomes(
        GROUP, "redrive.requests", publisher, ConsumerMetrics(), Hooks(), RecentIds(), False
    )
    steps = build_steps([route], KeyOrders(None, None), Breakers())
    records = Pipeline(GROUP, reads, steps, outcomes, Breakers())
    return records, route, publisher


def kafka_record(offset: int, partition: int = 0) -> KafkaMessage:
    return KafkaMessage(
        topic="orders",
        partition=partition,
        offset=offset,
        key=b"key-%d" % offset,
        value=b"value-%d" % offset,
        headers=[("trace", b"t-%d" % offset)],
        timestamp=(1, NOW - 5000),
    )


def batches_for(
    handler: Callable[..., Any], max_records: int = 100, strategy: str = "topics"
) -> tuple[Batches, Pipeline, FakePublisher]:
    records, _, publisher = records_for(handler, strategy)
    batches = Batches(records, {"orders": BatchSettings(max_records, 0.0)})
    return batches, records, publisher


def take(batches: Batches, *offsets: int, partition: int = 0, arrived: float = 0.0) -> None:
    for offset in offsets:
        record = kafka_record(offset, partition)
        assert batches.topics["orders"].take(record, "orders", partition, offset, arrived) is None


def test_a_failed_record_of_a_batch_becomes_the_retry_of_a_single_failed_record() -> None:
    error = ValueError("declined")

    def single(message: Message) -> None:
        raise error

    records, _, single_sent = records_for(single)
    assert records.process(kafka_record(11), "orders", 0, 11) is None

    def batch_handler(batch: list[Message]) -> None:
        raise BatchFailed([(batch[1], error)])

    batches, batch_records, batch_sent = batches_for(batch_handler)
    take(batches, 10, 11, 12)
    assert batches.flush(0.0) == {("orders", 0): 12}
    assert batch_records.handled == {"orders": 2}
    [one], [other] = single_sent.sent, batch_sent.sent
    assert one["topic"] == other["topic"] == f"{GROUP}.orders.retry.1s"
    # The trace says where the error was raised; everything else is the same bytes.
    without_trace = [
        encode(dataclasses.replace(sent.pop("redrive"), error_trace=None), [])
        for sent in (one, other)
    ]
    assert without_trace[0] == without_trace[1]
    assert one == other
    request = decode(without_trace[0])[0]
    assert request.attempt == 1 and request.original_offset == 11
    assert request.error_type is not None and request.error_type.endswith("ValueError")


def test_any_other_exception_fails_every_record_of_the_batch() -> None:
    def handler(batch: list[Message]) -> None:
        raise RuntimeError("database down")

    batches, records, publisher = batches_for(handler, strategy="service")
    take(batches, 0, 1, 2)
    assert batches.flush(0.0) == {("orders", 0): 2}
    assert records.handled == {}
    assert [sent["topic"] for sent in publisher.sent] == ["redrive.requests"] * 3
    assert [sent["key"] for sent in publisher.sent] == [b"key-0", b"key-1", b"key-2"]
    retried = records.outcomes.metrics.registry.get_sample_value(
        "redrive_consumer_records_total", {"topic": "orders", "outcome": "retried"}
    )
    assert retried == 3


def test_a_batch_handler_returning_an_awaitable_fails_every_record() -> None:
    async def later() -> None:
        raise AssertionError("never run")

    batches, records, publisher = batches_for(lambda batch: later())
    take(batches, 0, 1)
    batches.flush(0.0)
    assert records.handled == {} and len(publisher.sent) == 2
    request = publisher.sent[0]["redrive"]
    assert request.error_type == f"redrive.consumer.{AsyncHandlerError.__name__}"


def test_batches_are_cut_at_max_records_and_positions_wait_for_them() -> None:
    seen: list[list[int]] = []
    batches, records, _ = batches_for(lambda batch: seen.append([m.offset for m in batch]), 2)
    take(batches, 0, 1, 2)
    take(batches, 7, partition=1)
    assert batches.flush(0.0) == {("orders", 0): 2, ("orders", 1): 7}
    assert seen == [[0, 1], [2, 7]]
    assert records.handled == {"orders": 4}


def test_a_record_dealt_with_before_its_handler_keeps_its_place() -> None:
    seen: list[list[int]] = []
    batches, _, publisher = batches_for(lambda batch: seen.append([m.offset for m in batch]))
    pending = batches.topics["orders"]
    take(batches, 0)
    # A value the deserializer refuses: a dead letter at once, its offset held back.
    pending.steps.route.value_deserializer = lambda raw: int(raw)
    assert pending.take(kafka_record(1), "orders", 0, 1, 0.0) is None
    pending.steps.route.value_deserializer = None
    take(batches, 2)
    assert [e.message is None for e in pending.entries] == [False, True, False]
    assert [sent["topic"] for sent in publisher.sent] == ["orders.dlq"]
    assert batches.flush(0.0) == {("orders", 0): 2}
    assert seen == [[0, 2]]


def test_a_batch_waits_until_full_or_max_wait() -> None:
    records, route, _ = records_for(lambda batch: None)
    pending = Pending(records, route, BatchSettings(3, 1.0))
    assert not pending.due(100.0) and pending.deadline() is None
    entry = Entry(kafka_record(0), ("orders", 0), 0, message(0), 100.0)
    pending.entries.append(entry)
    pending.messages = 1
    assert pending.deadline() == 101.0
    assert not pending.due(100.5)
    assert pending.due(101.0)
    pending.entries += [dataclasses.replace(entry, offset=n, arrived=100.4) for n in (1, 2)]
    pending.messages = 3
    assert pending.due(100.5)  # full
    pending.forget({("orders", 0)})
    assert pending.entries == [] and pending.messages == 0 and not pending.due(200.0)


def test_the_poll_timeout_shrinks_to_the_batch_deadline_and_a_stop_flushes_it() -> None:
    seen: list[list[int]] = []
    records, _, _ = records_for(lambda batch: seen.append([m.offset for m in batch]))
    batches = Batches(records, {"orders": BatchSettings(100, 60.0)})
    assert batches.timeout(0.1) == 0.1  # nothing pending
    now = time.monotonic()
    take(batches, 0, 1, arrived=now)
    assert batches.timeout(0.1) == 0.1  # due in a minute: the usual timeout
    assert 59 < batches.timeout(100.0) <= 60
    assert not batches.due(now) and batches.flush(now) == {} and seen == []
    assert batches.due(now + 60)
    assert batches.flush(now, force=True) == {("orders", 0): 1}
    assert seen == [[0, 1]] and batches.timeout(0.1) == 0.1
