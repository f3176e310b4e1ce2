"""What the consumer library accepts as a handler, and the pure parts of how it treats
hostile records (times and forged redrive headers), without a broker."""

from __future__ import annotations

import functools
import gc
import warnings
from collections.abc import AsyncIterator

import pytest
from confluent_kafka import Message as KafkaMessage

from redrive import App, Message, Topics
from redrive.consumer import AsyncHandlerError
from redrive.consumer.handlers import is_async_callable, refuse_awaitable
from redrive.consumer.routes import Route
from redrive.consumer.transactions import transactional_id
from redrive.errors import ConfigError
from redrive.headers import MAX_INT32, MAX_INT64, RetryHeaders, encode
from redrive.kafka import message_time
from redrive.policy import policy
from redrive.router import header_time, read_delivery

pytestmark = pytest.mark.unit


async def async_handler(message: Message) -> None:
    raise AssertionError("never run")


async def async_generator_handler(message: Message) -> AsyncIterator[None]:
    yield None


def plain_handler(message: Message) -> None:
    pass


class AsyncCallable:
    async def __call__(self, message: Message) -> None:
        raise AssertionError("never run")


class PlainCallable:
    def __call__(self, message: Message) -> None:
        pass

    async def method(self, message: Message) -> None:
        raise AssertionError("never run")


ASYNC = {
    "async def": async_handler,
    "async generator": async_generator_handler,
    "async __call__": AsyncCallable(),
    "async method": PlainCallable().method,
    "partial of async def": functools.partial(async_handler),
    "partial of partial of async __call__": functools.partial(functools.partial(AsyncCallable())),
    "async lambda-like partial with args": functools.partial(async_handler, Message),
}
PLAIN = {
    "def": plain_handler,
    "lambda": lambda message: None,
    "sync __call__": PlainCallable(),
    "partial of def": functools.partial(plain_handler),
    "builtin": print,
}


@pytest.mark.parametrize("name", ASYNC)
def test_async_callables_are_recognised(name: str) -> None:
    assert is_async_callable(ASYNC[name])


@pytest.mark.parametrize("name", PLAIN)
def test_plain_callables_are_not(name: str) -> None:
    assert not is_async_callable(PLAIN[name])


@pytest.mark.parametrize("name", sorted(set(ASYNC) - {"async generator"}))
def test_an_async_handler_is_registered_as_one(name: str) -> None:
    app = App("localhost:1", group="g")
    app.add_handler("orders", ASYNC[name], strategy="blocking")
    app.handler("payments", strategy="topics")(ASYNC[name])
    assert app.routes["orders"].is_async and app.routes["payments"].is_async


@pytest.mark.parametrize(
    "handler", [async_generator_handler, functools.partial(async_generator_handler)]
)
def test_an_async_generator_handler_is_refused_at_registration(handler: object) -> None:
    app = App("localhost:1", group="g")
    with pytest.raises(ConfigError, match="async generator") as refused:
        app.add_handler("orders", handler, strategy="blocking")  # type: ignore[arg-type]
    assert "handler for 'orders'" in str(refused.value) and "fix:" in str(refused.value)
    assert app.routes == {}  # nothing half-registered


@pytest.mark.parametrize("name", PLAIN)
def test_a_plain_handler_is_registered_as_plain(name: str) -> None:
    app = App("localhost:1", group="g")
    app.add_handler("orders", PLAIN[name], strategy="service")
    assert not app.routes["orders"].is_async


@pytest.mark.parametrize("bound", [0, -1, 1.5, True, "10", None])
def test_max_in_flight_must_be_a_whole_number(bound: object) -> None:
    with pytest.raises(ConfigError, match=r"max_in_flight"):
        App("localhost:1", group="g", max_in_flight=bound)  # type: ignore[arg-type]


def test_a_plain_handler_is_accepted_and_a_non_callable_refused() -> None:
    app = App("localhost:1", group="g")
    app.add_handler("a", plain_handler, strategy="blocking")
    app.handler("b", strategy="blocking")(PlainCallable())
    assert set(app.routes) == {"a", "b"}
    with pytest.raises(ConfigError, match="is not callable"):
        app.add_handler("c", "not a function", strategy="blocking")  # type: ignore[arg-type]


def test_a_returned_coroutine_is_closed_unrun_and_without_a_warning() -> None:
    ran: list[bool] = []

    async def body() -> None:
        ran.append(True)

    coroutine = body()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        error = refuse_awaitable(coroutine)
        del coroutine
        gc.collect()
    assert not ran
    assert [w for w in caught if issubclass(w.category, RuntimeWarning)] == []
    assert isinstance(error, AsyncHandlerError) and isinstance(error, TypeError)
    assert "coroutine" in str(error) and "declare the handler itself async def" in str(error)
    assert type(error).__module__ == "redrive.consumer"


def record(timestamp: tuple[int, int]) -> KafkaMessage:
    return KafkaMessage(topic="t", partition=0, offset=0, value=b"v", timestamp=timestamp)


@pytest.mark.parametrize(
    ("timestamp", "expected"),
    [
        ((0, 0), None),  # no timestamp
        ((0, 1_700_000_000_000), None),
        ((1, 0), 0),  # the epoch itself (librdkafka cannot produce it: 0 means "now")
        ((1, -1), None),
        ((1, -5), None),
        ((1, -(2**63)), None),
        ((1, 2**63 - 1), 2**63 - 1),
        ((2, 1_700_000_000_000), 1_700_000_000_000),  # log append time
    ],
)
def test_record_times_are_read_as_a_header_can_hold_them(
    timestamp: tuple[int, int], expected: int | None
) -> None:
    assert message_time(record(timestamp)) == expected
    if expected is not None:  # and they make valid redrive headers
        RetryHeaders(destination="t", retry_at=0, original_timestamp=expected)


def test_a_deadline_past_the_largest_header_time_is_capped() -> None:
    assert header_time(None) is None
    assert header_time(5) == 5
    assert header_time(MAX_INT64 + 10 * 365 * 86_400_000) == MAX_INT64


def test_a_forged_attempt_count_at_the_top_of_its_range_leaves_room_for_one_more() -> None:
    forged = RetryHeaders(destination="t", retry_at=1, attempt=MAX_INT32, group="mine")
    delivery = read_delivery(encode(forged), "mine")
    assert delivery is not None and delivery.attempt == MAX_INT32 - 1
    RetryHeaders(destination="t", retry_at=1, attempt=delivery.attempt + 1)  # still valid


@pytest.mark.parametrize(
    ("headers", "expected_attempt"),
    [
        ([("redrive-attempt", b"-5")], None),  # no destination nor retry-at: no delivery
        (
            [
                ("redrive-destination", b"t"),
                ("redrive-retry-at", b"99999999999999999999"),
                ("redrive-attempt", b"3"),
            ],
            None,
        ),
        (
            [
                ("redrive-destination", b"t"),
                ("redrive-retry-at", b"1"),
                ("redrive-attempt", b"-5"),
                ("redrive-deadline", b"\xff\xfe"),
            ],
            1,
        ),
        (
            [
                ("redrive-destination", b"t"),
                ("redrive-retry-at", b"1"),
                ("redrive-attempt", b"4"),
                ("redrive-group", b"someone-else"),
            ],
            None,  # another group's retry is a first delivery to us
        ),
        (
            [
                ("redrive-destination", b"t"),
                ("redrive-retry-at", b"1"),
                ("redrive-attempt", b"4"),
                ("redrive-group", None),
            ],
            4,
        ),
    ],
)
def test_forged_redrive_headers_are_read_leniently(
    headers: list[tuple[str, bytes | None]], expected_attempt: int | None
) -> None:
    delivery = read_delivery(headers, "mine")
    assert (delivery.attempt if delivery else None) == expected_attempt


def test_tiers_are_per_group_and_need_a_group_that_makes_a_topic_name() -> None:
    route = Route("orders", plain_handler, policy("5s, 1m x2"), Topics(), "billing")
    assert sorted(route.tiers.values()) == ["billing.orders.retry.1m", "billing.orders.retry.5s"]
    with pytest.raises(ConfigError, match="not a legal Kafka topic name"):
        Route("orders", plain_handler, policy("5s"), Topics(), "billing/eu")


def test_a_tier_knows_its_delay() -> None:
    route = Route("orders", plain_handler, policy("5s, 1m x2"), Topics(), "g")
    assert route.tier_delay_ms("g.orders.retry.5s") == 5_000
    assert route.tier_delay_ms("g.orders.retry.1m") == 60_000
    with pytest.raises(KeyError):
        route.tier_delay_ms("orders")


def test_the_transactional_id_is_stable_for_a_static_member_only() -> None:
    assert transactional_id("billing", "billing-0") == "redrive.billing.billing-0"
    assert transactional_id("billing", "billing-0") == transactional_id("billing", "billing-0")
    assert transactional_id("billing", None) != transactional_id("billing", None)
    assert transactional_id("billing", None).startswith("redrive.billing.")
