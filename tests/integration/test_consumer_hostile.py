"""No record stops an App (issue 14): records that confluent-kafka cannot read, or
that carry extreme or forged contents, end handled, retried or dead-lettered, and
the App goes on. And a handler that returns a coroutine fails its record instead of
counting it as handled.

Everything goes through the real broker (and the real retry service for strategy
`service`); records confluent-kafka's producer cannot write (a header name that is
not UTF-8) are written with kcat."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition

from redrive import App, Message
from redrive.consumer import AsyncHandlerError
from redrive.headers import decode, is_redrive_header
from redrive.policy import DeadLetter, DeadLetterReason
from tests.integration.consumer_harness import Calls, running_app
from tests.integration.kcat import RawHeader, kcat_produce
from tests.integration.service_harness import (
    Collector,
    fresh_database,
    produce,
    running_service,
    settings_for,
)

pytestmark = pytest.mark.integration

STRATEGIES = ["blocking", "pause", "topics", "topics ordered", "service"]
"""The apps fed: one per strategy, and `topics` with ``ordering="key"`` (its key lines in
the tiers, with transactions)."""

# The poison pill: a header name that is not UTF-8 among readable ones.
BAD_KEY = b"bad-key \x01\xfe\xff"
BAD_VALUE = b"bad value \xff\xfe\x01 = and\nnewline"
BAD_HEADERS: list[RawHeader] = [(b"x-\xff\xfe", b"1"), (b"good", b"2"), (b"redrive-\xff", b"3")]


def a_group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def handled_count(app: App, topic: str, outcome: str = "handled") -> float:
    labels = {"topic": topic, "outcome": outcome}
    return app.metrics.registry.get_sample_value("redrive_consumer_records_total", labels) or 0.0


def committed(bootstrap: str, group: str, topic: str) -> int | None:
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        [tp] = probe.committed([TopicPartition(topic, 0)], timeout=10)
        return tp.offset if tp.offset >= 0 else None
    finally:
        probe.close()


# ------------------------------------------------------------------ async handlers


def test_a_handler_returning_a_coroutine_fails_its_record_by_its_policy(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("coroutine")
    calls = Calls()
    ran: list[bytes | None] = []
    deads: list[tuple[Message | None, DeadLetter, BaseException]] = []

    async def body(message: Message) -> None:
        ran.append(message.raw_value)

    def handler(message: Message) -> Any:  # plain, so registration cannot tell
        calls.add(message)
        return body(message) if message.raw_value == b"async" else None

    app = App(bootstrap, group=a_group(), on_dead_letter=lambda *dead: deads.append(dead))
    app.add_handler(topic, handler, policy="200ms", strategy="blocking")
    with running_app(app):
        produce(bootstrap, topic, [{"key": b"k", "value": v} for v in (b"async", b"fine")])
        assert calls.wait_for(lambda: bool(deads) and bool(calls.of(b"fine")), 20)
        assert app.running.is_set()

    assert ran == []  # the coroutine was closed, never run
    assert [c.attempt for c in calls.of(b"async")] == [1, 2]  # retried by the policy...
    [(message, dead, error)] = deads  # ...then a dead letter, never counted as handled
    assert message is not None and message.raw_value == b"async"
    assert dead.reason is DeadLetterReason.ATTEMPTS_EXHAUSTED
    assert isinstance(error, AsyncHandlerError) and "does not await" in str(error)
    assert handled_count(app, topic) == 1  # "fine" only
    assert handled_count(app, topic, "retried") == 1
    assert handled_count(app, topic, "dead_lettered") == 1


# ------------------------------------------------------------------ the poison pill


@pytest.mark.parametrize("where", ["blocking", "pause", "topics", "topics tier"])
def test_a_header_name_that_is_not_utf8_makes_a_dead_letter_and_the_app_goes_on(
    where: str, bootstrap: str, new_topic: Callable[..., str]
) -> None:
    strategy = where.split()[0]
    topic = new_topic(f"pill-{strategy}")
    group = a_group()
    calls = Calls()
    app = App(bootstrap, group=group)
    app.add_handler(topic, calls.add, policy="1s", strategy=strategy)  # type: ignore[arg-type]
    target = next(iter(app.routes[topic].tiers.values())) if where.endswith("tier") else topic
    with running_app(app), ExitStack() as stack:
        collector = Collector(bootstrap, f"{topic}.dlq")  # the app has created it
        stack.callback(collector.close)
        produce(bootstrap, target, [{"key": b"k1", "value": b"good-1"}])
        kcat_produce(bootstrap, target, BAD_KEY, BAD_VALUE, BAD_HEADERS)
        produce(
            bootstrap, target, [{"key": b"k2", "value": b"good-2", "headers": [("h", b"\xff")]}]
        )
        assert calls.wait_for(lambda: bool(calls.of(b"good-1") and calls.of(b"good-2")), 20)
        received = collector.poll_until(1, 20)
        assert app.running.is_set()
    # The stop committed past all three: a restart does not meet the bad record again.
    assert committed(bootstrap, group, target) == 3
    assert [c.value for c in calls.items] == [b"good-1", b"good-2"]
    assert calls.of(b"good-2")[0].headers == [("h", b"\xff")]
    assert len(received) == 1
    letter = received[0]
    assert letter.key == BAD_KEY and letter.value == BAD_VALUE  # byte for byte
    request, users = decode(letter.headers)
    assert users == [("good", b"2")]  # what could be read; the bad names are gone
    assert request.send_to == "dlq" and request.attempt == 1
    assert request.original_topic == target and request.original_offset == 1
    assert request.error_type == "redrive.consumer.UnreadableHeadersError"
    reason = request.reason or ""
    assert reason.startswith("fatal error: headers unreadable"), reason
    assert "not valid UTF-8" in reason and "x-\\xff\\xfe" in reason, reason
    assert handled_count(app, topic) == 2 and handled_count(app, topic, "dead_lettered") == 1


def test_with_the_service_strategy_the_poison_pill_is_in_the_store_and_the_api(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("pill-service")
    calls = Calls()
    settings = settings_for(bootstrap, fresh_database(database_url), allowed_destinations=[topic])
    with running_service(settings) as service:
        app = App(bootstrap, group=a_group(), requests_topic=settings.requests_topic)
        app.add_handler(topic, calls.add, strategy="service", dead_letters="service")
        with (
            running_app(app),
            httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as api,
        ):
            kcat_produce(bootstrap, topic, BAD_KEY, BAD_VALUE, BAD_HEADERS)
            produce(bootstrap, topic, [{"key": b"k", "value": b"good"}])
            assert calls.wait_for(lambda: bool(calls.of(b"good")), 20)

            def listed() -> list[dict[str, Any]]:
                items: list[dict[str, Any]] = api.get("/api/v1/dead-letters").json()["items"]
                return items

            assert calls.wait_for(lambda: bool(listed()), 20)
            [item] = listed()
            letter = api.get(f"/api/v1/dead-letters/{item['id']}").json()
            assert app.running.is_set()
    assert [c.value for c in calls.items] == [b"good"]
    assert (
        item["topic"] == topic and item["error_type"] == "redrive.consumer.UnreadableHeadersError"
    )
    assert "not valid UTF-8" in item["reason"]
    assert base64.b64decode(letter["key"]["base64"]) == BAD_KEY
    assert base64.b64decode(letter["value"]["base64"]) == BAD_VALUE
    assert [h["name"] for h in letter["headers"] if not is_redrive_header(h["name"])] == ["good"]


# ------------------------------------------------------------------ the largest records


def test_a_record_as_large_as_its_topic_allows_is_retried_and_dead_lettered(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """A 1,000,000-byte record (under Kafka's default topic limit, over librdkafka's
    default message.max.bytes once the redrive headers are added) fails: it goes to its
    tier topic and, spent, to its dead-letter topic, instead of stopping the App."""
    topic = new_topic("large")
    big = bytes(range(256)) * 3906 + b"tail"  # 1,000,000 bytes
    calls = Calls()

    def handler(message: Message) -> None:
        calls.add(message)
        raise ConnectionError("downstream unavailable " + "x" * 4000)  # a long trace too

    app = App(bootstrap, group=a_group())
    app.add_handler(topic, handler, policy="200ms", strategy="topics")
    with running_app(app), ExitStack() as stack:
        letters = Collector(bootstrap, f"{topic}.dlq")  # the app has created it
        stack.callback(letters.close)
        produce(bootstrap, topic, [{"key": b"big", "value": big}])
        produce(bootstrap, topic, [{"key": b"small", "value": b"after"}])
        assert calls.wait_for(lambda: len(calls.of(big)) == 2, 30), "not retried"
        assert [d.value for d in letters.poll_until(2, 30)].count(big) == 1
        assert app.running.is_set()
    assert [c.attempt for c in calls.of(big)] == [1, 2]
    assert [c.attempt for c in calls.of(b"after")] == [1, 2]
