"""The classification of retry requests (intake's and the Spark scheduler's), without a broker."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redrive.headers import RetryHeaders, encode, failure_id, request_id
from redrive.reasons import DeadLetterReason as Reason
from redrive.records import (
    DeadLetterRecord,
    PendingRetry,
    Release,
    RequestCoordinates,
    order_queue,
)
from redrive.requests import (
    Incoming,
    IntakeRules,
    classify,
    content_of,
    identity,
    read_at_identity,
)

pytestmark = pytest.mark.unit

NOW = 1_800_000_000_000
TOPICS = {"orders": 3, "items": 1}
RULES = IntakeRules(
    destination_allowed=lambda t: t in {"orders", "forbidden-but-exists"},
    partitions_of=TOPICS.get,
    max_delay_ms=7 * 86_400_000,
)


def incoming(headers: list[tuple[str, bytes | None]], value: bytes | None = b"v") -> Incoming:
    return Incoming("redrive.requests", 4, 99, b"k", value, headers)


def test_a_valid_request_becomes_a_pending_retry_keeping_everything() -> None:
    headers = encode(
        RetryHeaders(
            destination="orders",
            retry_at=NOW + 5_000,
            attempt=2,
            partition=1,
            group="g",
            original_topic="orders",
            original_partition=0,
            original_offset=7,
        ),
        [("mine", b"\xff")],
    )
    result = classify(incoming(headers), RULES, NOW)
    assert isinstance(result, PendingRetry)
    assert (result.due_ms, result.destination, result.partition) == (NOW + 5_000, "orders", 1)
    assert result.headers == headers  # delivered exactly as received
    assert (result.key, result.value, result.attempt, result.group) == (b"k", b"v", 2, "g")
    assert (result.request.topic, result.request.partition, result.request.offset) == (
        "redrive.requests",
        4,
        99,
    )


def test_a_replayed_records_round_is_kept_by_its_retry_and_its_dead_letter() -> None:
    """The service and the Spark scheduler (both classify) keep the loop guard's
    headers: a retry is delivered with them, a dead letter names its round."""
    request = RetryHeaders(destination="orders", retry_at=NOW, replays=2, replay_of=41)
    retry = classify(incoming(encode(request)), RULES, NOW)
    assert isinstance(retry, PendingRetry)
    assert ("redrive-replays", b"2") in retry.headers
    assert ("redrive-replay-of", b"41") in retry.headers
    dead = RetryHeaders(destination="orders", retry_at=NOW, send_to="dlq", replays=2, replay_of=41)
    letter = classify(incoming(encode(dead)), RULES, NOW)
    assert isinstance(letter, DeadLetterRecord)
    assert (letter.replays, letter.replay_of) == (2, 41)


@pytest.mark.parametrize(
    ("fields", "value", "code", "text"),
    [
        ({"destination": "items"}, b"v", Reason.DESTINATION_NOT_ALLOWED, "not in the allowlist"),
        ({"send_to": "dlq"}, b"v", Reason.SENT_TO_DLQ, "redrive-send-to: dlq"),
        (
            {"send_to": "dlq", "reason_code": "attempts_exhausted"},
            b"v",
            Reason.ATTEMPTS_EXHAUSTED,
            "redrive-send-to: dlq",
        ),
        ({"send_to": "dlq", "reason_code": "fatal_error"}, b"v", Reason.FATAL_ERROR, "dlq"),
        ({}, b"", Reason.EMPTY_VALUE, "empty value"),
        ({}, None, Reason.EMPTY_VALUE, "empty value"),
        ({"deadline": NOW - 1}, b"v", Reason.DEADLINE_PASSED, "deadline passed"),
        (
            {"retry_at": NOW + 10_000, "deadline": NOW + 5_000},
            b"v",
            Reason.DEADLINE_PASSED,
            "due after its deadline",
        ),
        ({"retry_at": NOW + 8 * 86_400_000}, b"v", Reason.RETRY_AT_TOO_FAR, "days ahead"),
        (
            {"destination": "forbidden-but-exists"},
            b"v",
            Reason.UNKNOWN_DESTINATION,
            "does not exist",
        ),
        ({"partition": 3}, b"v", Reason.PARTITION_OUT_OF_RANGE, "has 3 partition(s)"),
    ],
)
def test_refusals_name_the_problem(
    fields: dict[str, object], value: bytes | None, code: str, text: str
) -> None:
    base: dict[str, object] = {"destination": "orders", "retry_at": NOW + 1_000}
    headers = encode(RetryHeaders(**{**base, **fields}))  # type: ignore[arg-type]
    result = classify(incoming(headers, value), RULES, NOW)
    assert isinstance(result, DeadLetterRecord)
    assert result.reason_code == code
    assert text in result.reason
    assert result.headers == headers and result.value == value


def test_undecodable_headers_still_keep_what_is_readable() -> None:
    headers = [
        ("redrive-destination", b"orders"),
        ("redrive-retry-at", b"soon"),
        ("redrive-error-type", b"app.Boom"),
        ("x", b"\x00"),
    ]
    result = classify(incoming(headers), RULES, NOW)
    assert isinstance(result, DeadLetterRecord)
    assert result.reason_code == Reason.INVALID_REQUEST
    assert "redrive-retry-at: not a decimal integer" in result.reason
    assert (result.topic, result.error_type, result.headers) == ("orders", "app.Boom", headers)


header_names = st.one_of(
    st.sampled_from(
        [
            "redrive-destination",
            "redrive-retry-at",
            "redrive-attempt",
            "redrive-partition",
            "redrive-deadline",
            "redrive-send-to",
            "redrive-group",
            "redrive-x",
            "user",
        ]
    ),
    st.text(max_size=20),
)
header_values = st.one_of(
    st.none(),
    st.binary(max_size=40),
    st.sampled_from(
        [
            b"orders",
            b"items",
            b"1",
            b"0",
            b"-1",
            b"dlq",
            b"retry",
            str(NOW + 1000).encode(),
            b"99999999999999999999999",
        ]
    ),
)


@settings(max_examples=400, deadline=None)
@given(
    headers=st.lists(st.tuples(header_names, header_values), max_size=10),
    value=st.one_of(st.none(), st.binary(max_size=10)),
)
def test_any_message_ends_as_exactly_one_outcome_and_never_raises(
    headers: list[tuple[str, bytes | None]], value: bytes | None
) -> None:
    result = classify(incoming(headers, value), RULES, NOW)
    assert isinstance(result, PendingRetry | DeadLetterRecord | Release)
    if isinstance(result, Release):
        return
    if isinstance(result, DeadLetterRecord):
        assert result.reason and result.reason_code
        assert result.headers == headers and result.value == value
    else:
        assert RULES.destination_allowed(result.destination)
        assert result.due_ms <= NOW + RULES.max_delay_ms


# ---------------------------------------------------------------- key order


def _ordered(order: str, attempt: int, **overrides: object) -> list[tuple[str, bytes | None]]:
    fields: dict[str, object] = {
        "destination": "orders",
        "retry_at": NOW,
        "attempt": attempt,
        "group": "billing",
        "original_topic": "orders",
        "original_partition": 2,
        "original_offset": 41,
        "order": order,
        **overrides,
    }
    return encode(RetryHeaders(**fields))  # type: ignore[arg-type]


def test_a_release_names_its_key_queue_and_head() -> None:
    result = classify(incoming(_ordered("release", 0), value=None), RULES, NOW)
    released = failure_id("billing", "orders", 2, 41, 0, release=True)
    assert result == Release(
        order_queue("billing", "orders", 2, b"k"),
        41,
        0,
        incoming([]).coordinates,
        bytes.fromhex(released),
        content_of(b"k", None, vouched=False),
    )


def test_a_request_is_identified_by_its_id_else_by_its_failure_else_where_it_was_read() -> None:
    # What a repeat of it carries too, whoever repeats it.
    here = RequestCoordinates("redrive.requests", 0, 5)
    failure = RetryHeaders(
        destination="orders",
        retry_at=NOW,
        attempt=2,
        group="billing",
        original_topic="orders",
        original_partition=1,
        original_offset=7,
    )
    named = dataclasses.replace(failure, id="ab" * 16)
    assert identity(named, here) == bytes.fromhex("ab" * 16)
    assert identity(failure, here) == bytes.fromhex(request_id(failure))
    assert identity(failure, here) == identity(failure, here._replace(offset=6))
    anonymous = RetryHeaders(destination="orders", retry_at=NOW)
    assert (
        identity(anonymous, here) == identity(None, here) != identity(None, here._replace(offset=6))
    )
    assert len(identity(None, here)) == len(identity(failure, here)) == 16


def test_records_of_a_key_queue_keep_its_identity_and_a_tombstone_may_wait_behind() -> None:
    head = classify(incoming(_ordered("key", 1)), RULES, NOW)
    behind = classify(incoming(_ordered("behind", 0, original_offset=42), value=None), RULES, NOW)
    assert isinstance(head, PendingRetry) and isinstance(behind, PendingRetry)
    assert head.order == "key" and behind.order == "behind"
    assert head.order_queue == behind.order_queue == order_queue("billing", "orders", 2, b"k")
    assert behind.value is None  # a delete of the key, kept in its order
    # Not behind a head: an empty retry is still refused.
    empty = classify(incoming(_ordered("key", 1), value=None), RULES, NOW)
    assert isinstance(empty, DeadLetterRecord) and empty.reason_code == Reason.EMPTY_VALUE


def test_queues_of_other_keys_groups_or_partitions_are_other_queues() -> None:
    queues = {
        order_queue("billing", "orders", 2, b"k"),
        order_queue("billing", "orders", 2, b"k2"),
        order_queue("billing", "orders", 2, None),
        order_queue("billing", "orders", 1, b"k"),
        order_queue("audit", "orders", 2, b"k"),
        order_queue("billing", "items", 2, b"k"),
        order_queue(None, "orders", 2, b"k"),
    }
    assert len(queues) == 7


def test_an_ordered_request_without_its_queue_or_where_none_is_kept_is_refused() -> None:
    missing = classify(incoming(_ordered("behind", 0, group=None)), RULES, NOW)
    assert isinstance(missing, DeadLetterRecord)
    assert missing.reason_code == Reason.INVALID_REQUEST
    assert "missing redrive-group" in missing.reason
    spark = IntakeRules(RULES.destination_allowed, RULES.partitions_of, RULES.max_delay_ms, False)
    refused = classify(incoming(_ordered("key", 1)), spark, NOW)
    assert isinstance(refused, DeadLetterRecord)
    assert "needs the retry service" in refused.reason


@given(
    st.text(max_size=249),
    st.integers(min_value=0, max_value=2**31 - 1),
    st.integers(min_value=0, max_value=2**63 - 1),
)
def test_an_identity_taken_where_a_request_was_read_is_the_digest_stored_before(
    topic: str, partition: int, offset: int
) -> None:
    """Stored identities are digests of this JSON text: repeats read after an upgrade
    are still known, whatever the topic's characters."""

    text = json.dumps(["request", topic, partition, offset], separators=(",", ":")).encode()
    expected = hashlib.blake2b(text, digest_size=16).digest()
    assert read_at_identity(RequestCoordinates(topic, partition, offset)) == expected
