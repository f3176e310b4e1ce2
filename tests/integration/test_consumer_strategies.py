"""Each strategy, same policy: retried at the policy's delays, dead-lettered after
exactly its attempts, fatal errors straight to the dead letters."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import pytest

from redrive import App, FatalError, Message
from redrive.headers import RetryHeaders, decode, failure_request_id
from tests.integration.consumer_harness import Calls, retry_service, running_app
from tests.integration.service_harness import Collector, dead_letters, produce

pytestmark = pytest.mark.integration

STRATEGIES = ["blocking", "pause", "topics", "retry-topic", "service"]
POLICY = "1s, 2s"  # two retries: three attempts in all


class Flaky(Exception):
    pass


@contextmanager
def app_for(
    strategy: str, bootstrap: str, database_url: str, topic: str, handler: Callable[[Message], None]
) -> Iterator[tuple[App, str | None]]:
    """A running app with one handler; for `service`, a retry service beside it.
    Yields the app and the service's database URL (None for other strategies)."""
    with ExitStack() as stack:
        db = None
        requests_topic = "redrive.requests"
        if strategy == "service":
            service = stack.enter_context(
                retry_service(bootstrap, database_url, allowed_destinations=[topic])
            )
            requests_topic = service.settings.requests_topic
            db = service.database_url
        app = App(bootstrap, group=f"g-{uuid.uuid4().hex[:8]}", requests_topic=requests_topic)
        app.add_handler(topic, handler, policy=POLICY, strategy=strategy, fatal_on=[KeyError])
        stack.enter_context(running_app(app))
        yield app, db


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_failing_twice_then_succeeding_is_called_three_times_at_the_delays(
    strategy: str, bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(f"flaky-{strategy}", partitions=2)
    calls = Calls()
    seen: list[tuple[int, RetryHeaders | None]] = []  # (offset, message.retry) per call

    def handler(message: Message) -> None:
        calls.add(message)
        seen.append((message.offset, message.retry))
        if message.attempt < 3:
            raise Flaky(f"attempt {message.attempt}")

    with app_for(strategy, bootstrap, database_url, topic, handler) as (app, _):
        produce(
            bootstrap, topic, [{"key": b"k1", "value": b"flaky", "headers": [("trace", b"t-1")]}]
        )
        assert calls.wait_for(lambda: len(calls.of(b"flaky")) >= 3, 30)
        calls.wait_for(lambda: len(calls.of(b"flaky")) > 3, 1.5)  # no fourth call comes
    got = calls.of(b"flaky")
    assert [c.attempt for c in got] == [1, 2, 3]
    first_gap, second_gap = got[1].at_ms - got[0].at_ms, got[2].at_ms - got[1].at_ms
    assert first_gap >= 1000, f"second call came {first_gap} ms after the first"
    assert second_gap >= 2000, f"third call came {second_gap} ms after the second"
    assert first_gap < 4000 and second_gap < 5000  # and not forgotten
    for call in got:  # key and the user's headers survive every hop
        assert call.key == b"k1"
        assert call.headers == [("trace", b"t-1")]
    if strategy in ("topics", "retry-topic", "service"):
        # Each redelivery carries its request's redrive-id unchanged: the id of that
        # failure (the group, the record as read, the attempt that failed), so a new
        # one for each retry: where the record was first read, then the delivery.
        first_offset, first_retry = seen[0]
        assert first_retry is None
        first = failure_request_id(app.group, 1, (topic, got[0].partition, first_offset), None)
        second = failure_request_id(app.group, 2, ("unused", 0, 0), first)
        expected = [first, second]
        assert [retry.id if retry else None for _, retry in seen[1:3]] == expected


def dead_letter_of(strategy: str, bootstrap: str, topic: str, db: str | None) -> dict[str, object]:
    """The one dead letter the app wrote: from `<topic>.dlq`, or the service's store."""
    if strategy == "service":
        assert db is not None
        letters = dead_letters(db)
        assert len(letters) == 1
        letter = letters[0]
        return {
            "key": bytes(letter["msg_key"]),
            "value": bytes(letter["msg_value"]),
            "reason": letter["reason"],
            "reason_code": letter["reason_code"],
            "error_type": letter["error_type"],
            "attempt": letter["attempt"],
        }
    collector = Collector(bootstrap, f"{topic}.dlq")
    received = collector.poll_until(1, 20)
    collector.drain(1.0)
    collector.close()
    assert len(received) == 1
    request, users = decode(received[0].headers)
    assert users == [("trace", b"t-2")]
    assert request.send_to == "dlq" and request.original_topic == topic
    return {
        "key": received[0].key,
        "value": received[0].value,
        "reason": request.reason,
        "reason_code": request.reason_code,
        "error_type": request.error_type,
        "attempt": request.attempt,
    }


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_always_failing_is_dead_lettered_after_exactly_the_policy_attempts(
    strategy: str, bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(f"doomed-{strategy}")
    calls = Calls()

    def handler(message: Message) -> None:
        calls.add(message)
        raise Flaky("never works")

    with app_for(strategy, bootstrap, database_url, topic, handler) as (_, db):
        produce(
            bootstrap, topic, [{"key": b"k2", "value": b"doomed", "headers": [("trace", b"t-2")]}]
        )
        assert calls.wait_for(lambda: len(calls.of(b"doomed")) >= 3, 30)
        if strategy == "service":
            assert calls.wait_for(lambda: len(dead_letters(db or "")) >= 1, 20)
        calls.wait_for(lambda: len(calls.of(b"doomed")) > 3, 2.0)
        letter = dead_letter_of(strategy, bootstrap, topic, db)
    assert [c.attempt for c in calls.of(b"doomed")] == [1, 2, 3]
    assert letter["key"] == b"k2" and letter["value"] == b"doomed"
    assert "attempts exhausted (3 of 3)" in str(letter["reason"])
    assert letter["reason_code"] == "attempts_exhausted"  # in the header, and as stored
    assert str(letter["error_type"]).endswith("Flaky")
    assert letter["attempt"] == 3


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_fatal_error_goes_straight_to_the_dead_letters(
    strategy: str, bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(f"fatal-{strategy}")
    calls = Calls()

    def handler(message: Message) -> None:
        calls.add(message)
        if message.raw_value == b"poison":
            raise FatalError("cannot ever work")
        if message.raw_value == b"missing":
            raise KeyError("fatal_on lists KeyError")

    with app_for(strategy, bootstrap, database_url, topic, handler) as (_, db):
        produce(
            bootstrap, topic, [{"key": b"k3", "value": b"poison", "headers": [("trace", b"t-2")]}]
        )
        assert calls.wait_for(lambda: len(calls.of(b"poison")) >= 1, 20)
        if strategy == "service":
            assert calls.wait_for(lambda: len(dead_letters(db or "")) >= 1, 20)
        letter = dead_letter_of(strategy, bootstrap, topic, db)
        calls.wait_for(lambda: len(calls.of(b"poison")) > 1, 1.5)
    assert len(calls.of(b"poison")) == 1
    assert "fatal error" in str(letter["reason"])
    assert letter["reason_code"] == "fatal_error"
    assert letter["attempt"] == 1
