"""The failure router: one decision for the consumer library and the Spark pipeline.

Pure: no broker, no Spark; time comes from a fixed clock.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redrive.headers import (
    MAX_INT32,
    MAX_INT64,
    RetryHeaders,
    decode,
    describe_error,
    encode,
    failure_request_id,
    next_request,
    request_id,
)
from redrive.policy import (
    DeadLetter,
    DeadLetterReason,
    FatalError,
    Policy,
    Retry,
    parse_schedule,
    policy,
)
from redrive.router import (
    DeadLettered,
    FailedRecord,
    Retried,
    RetryTarget,
    Router,
    header_time,
    read_delivery,
    record_time,
)

pytestmark = pytest.mark.unit

NOW = 1_000_000
GROUP = "billing"


def router(chosen: Policy | None = None) -> Router:
    return Router(chosen or policy("1s x3"), GROUP, clock=lambda: NOW)


def failed(
    attempt: int = 1,
    delivery: RetryHeaders | None = None,
    timestamp: int | None = 999_000,
    topic: str = "orders",
) -> FailedRecord:
    return FailedRecord(topic, 1, 42, timestamp, b"k", b"v", [("trace", b"t")], delivery, attempt)


def through(record: FailedRecord, destination: str = "orders") -> RetryTarget:
    return RetryTarget.through("requests", destination, record)


def route(
    record: FailedRecord,
    error: BaseException,
    chosen: Policy | None = None,
    *,
    in_place: bool = False,
    first_failure_ms: int | None = None,
) -> Retried | DeadLettered:
    return router(chosen).route(
        record,
        error,
        retry_to=None if in_place else through(record),
        dead_letters="orders.dlq",
        home="orders",
        first_failure_ms=first_failure_ms,
    )


def redelivery(attempt: int, **fields: object) -> RetryHeaders:
    values: dict[str, object] = {
        "destination": "orders",
        "retry_at": NOW - 1,
        "attempt": attempt,
        "group": GROUP,
        "original_topic": "orders",
        "original_partition": 0,
        "original_offset": 7,
        "original_timestamp": 900_000,
    }
    values.update(fields)
    return RetryHeaders(**values)  # type: ignore[arg-type]


# ------------------------------------------------------------------------ retries


def test_a_first_failure_is_a_retry_request_back_to_its_partition() -> None:
    error = ConnectionError("gateway down")
    record = failed()
    outcome = route(record, error)
    assert isinstance(outcome, Retried)
    assert outcome.decision == Retry(at_ms=NOW + 1000, delay_ms=1000, attempt=1)
    assert outcome.target == RetryTarget("requests", "orders", None, 1)
    assert outcome.failed_at_ms == NOW
    expected = next_request(
        None,
        destination="orders",
        retry_at=NOW + 1000,
        error=describe_error(error),
        record_topic="orders",
        record_partition=1,
        record_offset=42,
        record_timestamp=999_000,
        group=GROUP,
        partition=1,
    )
    assert outcome.request == dataclasses.replace(expected, id=request_id(expected))


def test_a_retry_to_another_topic_is_partitioned_by_key() -> None:
    record = failed()
    target = RetryTarget.through("requests", "billing.orders.retry", record)
    assert target == RetryTarget("requests", "billing.orders.retry", None, None)
    outcome = router().route(
        record, ValueError("x"), retry_to=target, dead_letters="d", home="orders"
    )
    assert isinstance(outcome, Retried) and outcome.request is not None
    assert outcome.request.destination == "billing.orders.retry"
    assert outcome.request.partition is None


def test_a_redelivery_counts_on_and_keeps_its_origin() -> None:
    record = failed(attempt=3, delivery=redelivery(2, deadline=NOW + 10_000))
    outcome = route(record, ValueError("again"))
    assert isinstance(outcome, Retried) and outcome.request is not None
    request = outcome.request
    assert request.attempt == 3
    assert (request.original_topic, request.original_offset) == ("orders", 7)
    assert request.original_timestamp == 900_000
    assert request.deadline == NOW + 10_000
    assert request.error_type == "ValueError" and request.error_message == "again"


def _id_of(outcome: Retried | DeadLettered) -> str | None:
    if isinstance(outcome, Retried):
        return outcome.request.id if outcome.request is not None else None
    return outcome.headers.id


def test_a_repeated_hand_off_has_the_same_id_and_each_retry_a_new_one() -> None:
    delivered_as = "0" * 32
    record = failed(attempt=3, delivery=redelivery(2, id=delivered_as))
    first = route(record, ValueError("again"))
    # The same failure handed off again after a crash: later, with another error text.
    repeat = Router(policy("1s x3"), GROUP, clock=lambda: NOW + 5_000).route(
        record, ValueError("still"), retry_to=through(record), dead_letters="d", home="orders"
    )
    assert isinstance(first, Retried) and first.request is not None
    assert isinstance(repeat, Retried) and repeat.request is not None
    assert first.request.retry_at != repeat.request.retry_at
    assert first.request.id == repeat.request.id
    assert first.request.id == failure_request_id(GROUP, 3, ("orders", 1, 42), delivered_as)
    assert first.request.id != delivered_as  # not the delivered request's: a new failure
    # The request delivered twice (a crash between its delivery and its bookkeeping),
    # read at another offset: the same record, so its failure has the same id.
    again = dataclasses.replace(record, offset=43)
    assert _id_of(route(again, ValueError("x"))) == first.request.id
    # Another attempt, another group or another delivery: another id.
    others = [
        route(failed(attempt=2, delivery=redelivery(1, id=delivered_as)), ValueError("x")),
        route(failed(attempt=3, delivery=redelivery(2, id="1" * 32)), ValueError("x")),
        Router(policy("1s x3"), "shipping", clock=lambda: NOW).route(
            record, ValueError("x"), retry_to=through(record), dead_letters="d", home="orders"
        ),
    ]
    ids = {_id_of(o) for o in others}
    assert len(ids) == 3 and first.request.id not in ids


@given(
    original_offset=st.integers(0, 2**63 - 1),
    offsets=st.lists(st.integers(0, 2**63 - 1), min_size=2, max_size=2, unique=True),
    attempt=st.integers(1, 3),
)
def test_records_that_carry_the_same_original_coordinates_are_different_failures(
    original_offset: int, offsets: list[int], attempt: int
) -> None:
    # Any producer can write redrive's headers, and a stream processor copies them
    # along: two records read at two places are two failures, whatever their headers
    # claim, so a receiver does not drop the second as a repeat of the first.
    forged = redelivery(attempt, original_offset=original_offset)  # no redrive-id
    one, other = (
        dataclasses.replace(failed(attempt=attempt + 1, delivery=forged), offset=o) for o in offsets
    )
    assert _id_of(route(one, ValueError("x"))) != _id_of(route(other, ValueError("x")))
    assert _id_of(route(one, ValueError("x"))) == _id_of(route(one, FatalError("y")))


def test_a_retry_in_place_writes_nothing_and_counts_from_its_first_failure() -> None:
    timed = Policy(parse_schedule("1s x5"), max_duration_ms=10_000)
    outcome = route(failed(attempt=2), ValueError("x"), timed, in_place=True)
    assert outcome == Retried(Retry(NOW + 1000, 1000, 2, NOW + 10_000))
    # The same failure 9.5 s after the first: the next retry would be past the deadline.
    late = route(
        failed(attempt=2), ValueError("x"), timed, in_place=True, first_failure_ms=NOW - 9_500
    )
    assert isinstance(late, DeadLettered)
    assert late.decision.reason is DeadLetterReason.DEADLINE_PASSED


# ------------------------------------------------------------------------ dead letters


def test_a_fatal_error_is_a_dead_letter_with_its_reason() -> None:
    record = failed(attempt=2, delivery=redelivery(1, deadline=NOW + 5))
    outcome = route(record, FatalError("no such customer"))
    assert isinstance(outcome, DeadLettered)
    assert outcome.topic == "orders.dlq"
    assert outcome.decision.reason is DeadLetterReason.FATAL_ERROR
    headers = outcome.headers
    assert headers.send_to == "dlq" and headers.reason == outcome.decision.text
    assert (headers.destination, headers.retry_at, headers.attempt) == ("orders", NOW, 2)
    assert headers.deadline == NOW + 5 and headers.group == GROUP
    assert headers.original_offset == 7  # where it was first consumed
    assert headers.error_type == "redrive.policy.FatalError"
    # The failure's id: what a retry of it would carry, so a receiver keeps one of them.
    retry = route(failed(attempt=2, delivery=redelivery(1)), ValueError("passing"))
    assert isinstance(retry, Retried) and retry.request is not None
    assert headers.id == retry.request.id == failure_request_id(GROUP, 2, ("orders", 1, 42), None)


def test_a_spent_policy_is_a_dead_letter() -> None:
    outcome = route(failed(attempt=4, delivery=redelivery(3)), ValueError("x"))
    assert isinstance(outcome, DeadLettered)
    assert outcome.decision == DeadLetter(
        DeadLetterReason.ATTEMPTS_EXHAUSTED, "attempts exhausted (4 of 4)", 4
    )
    assert outcome.headers.attempt == 4


def test_a_policy_that_raises_makes_a_dead_letter_not_a_crash() -> None:
    def predicate(error: BaseException) -> bool:
        raise LookupError("predicate broke")

    outcome = route(failed(), ValueError("x"), policy("1s x3", retryable=predicate))
    assert isinstance(outcome, DeadLettered)
    assert outcome.decision.reason is DeadLetterReason.FATAL_ERROR
    assert outcome.decision.text == (
        "policy error: deciding on ValueError raised LookupError: predicate broke"
    )
    assert outcome.headers.error_type == "ValueError"  # the record's own failure


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_in_the_policy_is_not_routed(stop: type[BaseException]) -> None:
    def predicate(error: BaseException) -> bool:
        raise stop

    with pytest.raises(stop):
        route(failed(), ValueError("x"), policy("1s x3", retryable=predicate))


def test_a_retry_request_that_cannot_be_written_is_a_dead_letter() -> None:
    record = failed()
    outcome = router().route(
        record,
        ValueError("x"),
        retry_to=RetryTarget("requests", "not a topic!"),
        dead_letters="orders.dlq",
        home="orders",
    )
    assert isinstance(outcome, DeadLettered)
    assert outcome.decision.reason is DeadLetterReason.INVALID_REQUEST
    assert outcome.decision.text.startswith("cannot write the retry request: ")
    assert outcome.headers.send_to == "dlq" and outcome.headers.destination == "orders"


def test_dead_letter_headers_that_cannot_be_written_keep_the_letter() -> None:
    outcome = router().route(
        failed(), FatalError("x"), retry_to=None, dead_letters="d", home="not a topic!"
    )
    assert isinstance(outcome, DeadLettered)
    assert outcome.headers.destination == "orders" and outcome.headers.send_to == "dlq"
    assert "headers incomplete" in (outcome.headers.reason or "")


def test_a_rejected_record_is_a_fatal_dead_letter_without_the_policy() -> None:
    def predicate(error: BaseException) -> bool:
        raise AssertionError("the policy is not asked")

    rejecting = Router(policy("1s", retryable=predicate), GROUP, clock=lambda: NOW)
    outcome = rejecting.reject(
        failed(attempt=3), ValueError("bad"), "value cannot be read", dead_letters="r", home="h"
    )
    assert outcome.topic == "r"
    assert outcome.decision == DeadLetter(
        DeadLetterReason.FATAL_ERROR, "fatal error: value cannot be read", 3
    )
    assert outcome.headers.destination == "h" and outcome.headers.attempt == 3


# ------------------------------------------------------------------------ times


def test_times_are_capped_to_what_headers_hold() -> None:
    assert header_time(None) is None
    assert header_time(5) == 5
    assert header_time(MAX_INT64 + 1) == MAX_INT64
    assert [record_time(t) for t in (None, -1, -(2**63), 0, 7, MAX_INT64)] == [
        None,
        None,
        None,
        0,
        7,
        MAX_INT64,
    ]


def test_a_deadline_from_a_far_future_timestamp_is_capped() -> None:
    from_stamp = Policy(
        parse_schedule("1s x3"), max_duration_ms=60_000, deadline_from="record-timestamp"
    )
    forged = redelivery(1, original_timestamp=MAX_INT64)
    outcome = route(failed(attempt=2, delivery=forged), ValueError("x"), from_stamp)
    assert isinstance(outcome, Retried) and outcome.request is not None
    assert outcome.decision.deadline_ms == MAX_INT64 + 60_000
    assert outcome.request.deadline == MAX_INT64


def test_a_record_without_a_timestamp_has_none_in_its_headers() -> None:
    outcome = route(failed(timestamp=-1), ValueError("x"))
    assert isinstance(outcome, Retried) and outcome.request is not None
    assert outcome.request.original_timestamp is None


# ------------------------------------------------------------------------ reading


def test_another_groups_retry_is_new_and_a_top_attempt_leaves_room() -> None:
    theirs = encode(redelivery(4, group="someone-else"))
    assert read_delivery(theirs, GROUP) is None
    top = read_delivery(encode(redelivery(MAX_INT32)), GROUP)
    assert top is not None and top.attempt == MAX_INT32 - 1


# ------------------------------------------------------------------------ properties

int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
attempts = st.integers(min_value=1, max_value=MAX_INT32)
errors = st.sampled_from([ValueError("v"), FatalError("f"), ConnectionError("c")])
policies = st.sampled_from(
    [
        policy("1s x3"),
        policy("5m, 1h", max_duration="2h"),
        Policy(parse_schedule("1s x9"), max_duration_ms=10_000, deadline_from="record-timestamp"),
        policy("exponential 1s x2 max 1m retries 8", fatal_on=ValueError),
    ]
)


@st.composite
def deliveries(draw: st.DrawFn) -> RetryHeaders | None:
    if draw(st.booleans()):
        return None
    maybe_time = st.none() | st.integers(min_value=0, max_value=MAX_INT64)
    return RetryHeaders(
        destination="orders",
        retry_at=draw(st.integers(min_value=0, max_value=MAX_INT64)),
        attempt=draw(st.integers(min_value=1, max_value=MAX_INT32 - 1)),
        deadline=draw(maybe_time),
        group=draw(st.sampled_from([None, GROUP])),
        original_topic=draw(st.sampled_from([None, "orders", "orders.retry.5m"])),
        original_offset=draw(st.none() | st.integers(min_value=0, max_value=MAX_INT64)),
        original_timestamp=draw(maybe_time),
    )


@settings(max_examples=300, deadline=None)
@given(
    chosen=policies,
    error=errors,
    delivery=deliveries(),
    attempt=attempts,
    timestamp=st.none() | int64,
    in_place=st.booleans(),
    first_failure=st.none() | st.integers(min_value=0, max_value=NOW),
)
def test_every_failure_routes_to_valid_headers(
    chosen: Policy,
    error: BaseException,
    delivery: RetryHeaders | None,
    attempt: int,
    timestamp: int | None,
    in_place: bool,
    first_failure: int | None,
) -> None:
    """Whatever a record carries, the router returns an outcome (never raises), its
    headers are what goes on the wire, and it counts the attempt that failed."""
    if delivery is not None:
        attempt = delivery.attempt + 1
    record = failed(attempt, delivery, timestamp)
    outcome = route(record, error, chosen, in_place=in_place, first_failure_ms=first_failure)
    if isinstance(outcome, DeadLettered):
        headers = outcome.headers
        assert headers.send_to == "dlq" and headers.reason == outcome.decision.text
        assert outcome.topic == "orders.dlq" and headers.retry_at == NOW
    else:
        assert outcome.decision.at_ms >= NOW  # never due before the failure
        if in_place:
            assert outcome.request is None and outcome.target is None
            return
        assert outcome.request is not None
        headers = outcome.request
        assert headers.send_to == "retry" and headers.retry_at == outcome.decision.at_ms
    assert headers.attempt == attempt and headers.group == GROUP
    assert decode(encode(headers))[0] == headers  # valid, exactly what is written
    if delivery is not None and (delivery.original_topic or delivery.original_offset):
        assert headers.original_topic == delivery.original_topic
        assert headers.original_offset == delivery.original_offset
    elif delivery is None:
        assert headers.original_offset == 42
        assert headers.original_timestamp == record_time(timestamp)


@settings(max_examples=100, deadline=None)
@given(attempt=attempts, group=st.sampled_from([None, GROUP, "other"]))
def test_what_is_read_always_has_room_for_one_more_failure(attempt: int, group: str | None) -> None:
    headers = encode(dataclasses.replace(redelivery(1), attempt=attempt, group=group))
    delivery = read_delivery(headers, GROUP)
    if group == "other":
        assert delivery is None
        return
    assert delivery is not None
    RetryHeaders(destination="t", retry_at=0, attempt=delivery.attempt + 1)
