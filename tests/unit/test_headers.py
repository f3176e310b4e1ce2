"""The header contract: encoding, strict and lenient decoding, validation, fuzzing."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redrive import header_decoding as D
from redrive import headers as H
from redrive.header_fields import INT_HEADERS
from redrive.headers import (
    HeaderError,
    RetryHeaders,
    decode,
    encode,
    read_delivery_headers,
    split_headers,
)
from redrive.reasons import GIVEN_UP, DeadLetterReason

pytestmark = pytest.mark.unit

REQUIRED = [(H.DESTINATION, b"orders"), (H.RETRY_AT, b"1700000000000")]


def reject(headers: Sequence[tuple[str, bytes | None]], header: str | None, problem: str) -> None:
    """decode() must fail naming ``header`` with ``problem`` in the message."""
    with pytest.raises(HeaderError) as caught:
        decode(headers)
    assert caught.value.header == header
    assert problem in caught.value.problem
    expected = f"{header}: {caught.value.problem}" if header else caught.value.problem
    assert str(caught.value) == expected


# ---------------------------------------------------------------- strategies

topics = st.from_regex(r"[a-zA-Z0-9._-]{1,249}", fullmatch=True).filter(
    lambda t: t not in (".", "..")
)
int64 = st.integers(0, H.MAX_INT64)
int32 = st.integers(0, H.MAX_INT32)
plain_text = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=200)
any_text = st.text(max_size=3000)  # surrogates included: must be made encodable
ids = st.text("0123456789abcdef", min_size=H.ID_LENGTH, max_size=H.ID_LENGTH)

requests = st.builds(
    RetryHeaders,
    destination=topics,
    retry_at=int64,
    attempt=st.integers(1, H.MAX_INT32),
    partition=st.none() | int32,
    deadline=st.none() | int64,
    send_to=st.sampled_from(["retry", "dlq"]),
    group=st.none() | plain_text,
    original_topic=st.none() | topics,
    original_partition=st.none() | int32,
    original_offset=st.none() | int64,
    original_timestamp=st.none() | int64,
    error_type=st.none() | plain_text,
    error_message=st.none() | any_text,
    error_trace=st.none() | st.text(max_size=10_000),
    id=st.none() | ids,
    order=st.none() | st.sampled_from(H.ORDERS),
)
# A dead letter may say why its consumer gave up; a retry may not.
retry_headers = st.tuples(requests, st.none() | st.sampled_from(H.GIVE_UPS)).map(
    lambda made: (
        dataclasses.replace(made[0], reason_code=made[1]) if made[0].send_to == "dlq" else made[0]
    )
)
user_names = st.text(max_size=30).filter(lambda n: not n.startswith(H.REDRIVE_PREFIX))
user_headers = st.lists(st.tuples(user_names, st.none() | st.binary(max_size=50)), max_size=8)


# ---------------------------------------------------------------- round trip


@given(retry_headers, user_headers)
def test_encode_decode_round_trip(h: RetryHeaders, user: list[tuple[str, bytes | None]]) -> None:
    encoded = encode(h, user)
    assert encoded[: len(user)] == user  # user's headers first, byte for byte
    decoded, rest = decode(encoded)
    assert decoded == h
    assert rest == user


def test_encode_writes_utf8_decimal_and_omits_absent_fields() -> None:
    h = RetryHeaders(destination="orders", retry_at=1700000000000, attempt=3, group="billing")
    assert encode(h) == [
        (H.DESTINATION, b"orders"),
        (H.RETRY_AT, b"1700000000000"),
        (H.ATTEMPT, b"3"),
        (H.SEND_TO, b"retry"),
        (H.GROUP, b"billing"),
    ]


def test_encode_drops_redrive_headers_among_user_headers() -> None:
    h = RetryHeaders(destination="orders", retry_at=5, attempt=2)
    old = [("trace-id", b"\x00\xff"), (H.ATTEMPT, b"1"), ("n", None), (H.ERROR_TYPE, b"X")]
    encoded = encode(h, old)
    assert encoded[:2] == [("trace-id", b"\x00\xff"), ("n", None)]
    names = [name for name, _ in encoded]
    assert names.count(H.ATTEMPT) == 1
    assert H.ERROR_TYPE not in names


def test_split_headers() -> None:
    redrive, user = split_headers([("a", b"1"), (H.ATTEMPT, b"1"), ("b", None), (H.ATTEMPT, b"2")])
    assert redrive == {H.ATTEMPT: b"2"}
    assert user == [("a", b"1"), ("b", None)]
    assert split_headers(None) == ({}, [])


def test_the_contract_is_exactly_these_headers() -> None:
    # The table of docs/headers.md, in the order encode() writes them.
    assert H.ALL_HEADERS == (
        "redrive-destination",
        "redrive-partition",
        "redrive-retry-at",
        "redrive-attempt",
        "redrive-deadline",
        "redrive-send-to",
        "redrive-group",
        "redrive-original-topic",
        "redrive-original-partition",
        "redrive-original-offset",
        "redrive-original-timestamp",
        "redrive-error-type",
        "redrive-error-message",
        "redrive-error-trace",
        "redrive-reason",
        "redrive-reason-code",
        "redrive-id",
        "redrive-order",
        "redrive-replays",
        "redrive-replay-of",
        "redrive-signature",
    )


# ---------------------------------------------------------------- validation rules


def test_missing_destination() -> None:
    reject([(H.RETRY_AT, b"1")], H.DESTINATION, "missing")


def test_missing_retry_at() -> None:
    reject([(H.DESTINATION, b"orders")], H.RETRY_AT, "missing")


def test_missing_everything_on_no_headers() -> None:
    reject([], H.DESTINATION, "missing")
    with pytest.raises(HeaderError):
        decode(None)


@pytest.mark.parametrize(
    "topic",
    [b"", b".", b"..", b"has space", b"a/b", b"x" * 250, "t\u00e9".encode()],
)
def test_destination_must_be_a_legal_topic(topic: bytes) -> None:
    reject([(H.DESTINATION, topic), (H.RETRY_AT, b"1")], H.DESTINATION, "not a valid Kafka topic")


def test_longest_legal_topic_is_accepted() -> None:
    decoded, _ = decode([(H.DESTINATION, b"a" * 249), (H.RETRY_AT, b"1")])
    assert decoded.destination == "a" * 249


def test_original_topic_must_be_a_legal_topic() -> None:
    reject([*REQUIRED, (H.ORIGINAL_TOPIC, b"a b")], H.ORIGINAL_TOPIC, "not a valid Kafka topic")


@pytest.mark.parametrize("value", [b"abc", b"1.5", b" 1", b"1_000", b"+1", b"", "\u0663".encode()])
def test_integers_must_be_decimal(value: bytes) -> None:
    reject([(H.DESTINATION, b"t"), (H.RETRY_AT, value)], H.RETRY_AT, "not a decimal integer")


def test_decimal_integer_message_shape() -> None:
    with pytest.raises(HeaderError) as caught:
        decode([(H.DESTINATION, b"t"), (H.RETRY_AT, b"abc")])
    assert str(caught.value) == "redrive-retry-at: not a decimal integer: 'abc'"


@pytest.mark.parametrize(
    "header",
    [H.RETRY_AT, H.PARTITION, H.DEADLINE, H.ORIGINAL_PARTITION, H.ORIGINAL_OFFSET, H.ATTEMPT],
)
def test_integers_must_not_be_negative(header: str) -> None:
    headers = [(n, v) for n, v in REQUIRED if n != header] + [(header, b"-1")]
    reject(headers, header, "must not be negative")


def test_attempt_must_be_at_least_one() -> None:
    reject([*REQUIRED, (H.ATTEMPT, b"0")], H.ATTEMPT, "must be >= 1")


def test_partition_out_of_int32_range() -> None:
    reject([*REQUIRED, (H.PARTITION, str(2**31).encode())], H.PARTITION, "out of range")


def test_time_out_of_int64_range() -> None:
    reject([(H.DESTINATION, b"t"), (H.RETRY_AT, str(2**63).encode())], H.RETRY_AT, "out of range")


def test_send_to_must_be_retry_or_dlq() -> None:
    reject([*REQUIRED, (H.SEND_TO, b"RETRY")], H.SEND_TO, "must be 'retry' or 'dlq'")
    decoded, _ = decode([*REQUIRED, (H.SEND_TO, b"dlq")])
    assert decoded.send_to == "dlq"


def test_a_reason_code_says_which_of_the_policys_reasons_and_only_for_a_dead_letter() -> None:
    dead = [*REQUIRED, (H.SEND_TO, b"dlq")]
    for code in H.GIVE_UPS:
        decoded, _ = decode([*dead, (H.REASON_CODE, code.encode())])
        assert decoded.reason_code == code
        # one of the stored codes: a policy's, or a return its consumer refused
        assert DeadLetterReason(code) in GIVEN_UP | {DeadLetterReason.INVALID_SIGNATURE}
    reject([*dead, (H.REASON_CODE, b"sent_to_dlq")], H.REASON_CODE, "must be one of")
    reject([*dead, (H.REASON_CODE, b"")], H.REASON_CODE, "must be one of")
    reject([*REQUIRED, (H.REASON_CODE, b"fatal_error")], H.REASON_CODE, "is for a dead letter")
    assert decode(dead)[0].reason_code is None


@pytest.mark.parametrize(
    "value",
    [b"", b"0" * 31, b"0" * 33, b"A" * 32, b"g" * 32, b"0" * 31 + b"\n", b"\xff" * 32],
)
def test_id_is_32_lowercase_hex_characters(value: bytes) -> None:
    problem = "not valid UTF-8" if value == b"\xff" * 32 else "32 lowercase hex characters"
    reject([*REQUIRED, (H.ID, value)], H.ID, problem)


def test_a_request_without_an_id_is_valid() -> None:
    # Requests written before redrive-id existed (or by producers that write none).
    decoded, _ = decode(REQUIRED)
    assert decoded.id is None
    with_id, _ = decode([*REQUIRED, (H.ID, b"0123456789abcdef" * 2)])
    assert with_id.id == "0123456789abcdef" * 2


def test_null_value() -> None:
    reject([*REQUIRED, (H.GROUP, None)], H.GROUP, "value is null")


def test_duplicate_header() -> None:
    reject([*REQUIRED, (H.ATTEMPT, b"1"), (H.ATTEMPT, b"2")], H.ATTEMPT, "more than once")


def test_unknown_redrive_header_is_a_typo() -> None:
    reject([*REQUIRED, ("redrive-atempt", b"2")], "redrive-atempt", "unknown redrive header")


def test_prefix_is_case_sensitive() -> None:
    decoded, user = decode([*REQUIRED, ("Redrive-Attempt", b"x")])
    assert user == [("Redrive-Attempt", b"x")]
    assert decoded.attempt == 1


def test_non_utf8_value() -> None:
    reject([*REQUIRED, (H.GROUP, b"\xff\xfe")], H.GROUP, "not valid UTF-8")


def test_empty_group() -> None:
    reject([*REQUIRED, (H.GROUP, b"")], H.GROUP, "empty")


@pytest.mark.parametrize(
    ("header", "cap"),
    [
        (H.ERROR_MESSAGE, H.MAX_ERROR_MESSAGE_BYTES),
        (H.ERROR_TRACE, H.MAX_ERROR_TRACE_BYTES),
        (H.GROUP, H.MAX_VALUE_BYTES),
        (H.ERROR_TYPE, H.MAX_VALUE_BYTES),
    ],
)
def test_oversized_values(header: str, cap: int) -> None:
    decode([*REQUIRED, (header, b"a" * cap)])  # exactly at the cap is fine
    reject([*REQUIRED, (header, b"a" * (cap + 1))], header, f"too long: {cap + 1} bytes")


def test_malformed_header_list() -> None:
    reject([("a", b"1"), ("b",)], None, "header 1 is not a (name, value) pair")  # type: ignore[list-item]
    reject([(b"a", b"1")], None, "non-str name")  # type: ignore[list-item]
    with pytest.raises(HeaderError):
        decode({"a": b"1"})  # type: ignore[dict-item]


def test_value_must_be_bytes() -> None:
    reject([*REQUIRED, (H.GROUP, "g")], H.GROUP, "must be bytes")  # type: ignore[list-item]


def test_constructor_validates_too() -> None:
    with pytest.raises(HeaderError) as caught:
        RetryHeaders(destination="orders", retry_at=1.7e12)  # type: ignore[arg-type]
    assert caught.value.header == H.RETRY_AT
    assert "must be an int" in caught.value.problem
    with pytest.raises(HeaderError) as caught:
        RetryHeaders(destination="orders", retry_at=1, group="\ud800")
    assert caught.value.header == H.GROUP


def test_header_error_pickles() -> None:
    error = pickle.loads(pickle.dumps(HeaderError(H.ATTEMPT, "bad")))
    assert (error.header, error.problem, str(error)) == (H.ATTEMPT, "bad", "redrive-attempt: bad")


# ---------------------------------------------------------------- fuzz

names = st.sampled_from(H.ALL_HEADERS) | st.sampled_from(["redrive-x", "redrive-", "k", ""])
values = st.none() | st.binary(max_size=40) | st.sampled_from([b"1", b"orders", b"retry", b"-3"])
header_lists = st.lists(st.tuples(names | st.text(max_size=12), values), max_size=20)


@settings(max_examples=500)
@given(header_lists)
def test_decode_raises_only_header_errors(headers: list[tuple[str, bytes | None]]) -> None:
    try:
        decoded, user = decode(headers)
    except HeaderError as error:
        assert error.problem
        return
    assert decode(encode(decoded, user)) == (decoded, user)


@settings(max_examples=300)
@given(header_lists)
def test_lenient_reader_never_raises(headers: list[tuple[str, bytes | None]]) -> None:
    result = read_delivery_headers(headers)
    assert result is None or isinstance(result, RetryHeaders)


# ---------------------------------------------------------------- decode's fast path
# decode() reads a well-formed list of (str, bytes) tuples in one pass and leaves
# everything else to _decode_checked, the careful reader; it must answer exactly as that
# reader does (same result and field types, same error and the same first error).


class _Str(str):
    pass


class _Bytes(bytes):
    pass


def _ints(low: int, high: int) -> tuple[st.SearchStrategy[bytes], st.SearchStrategy[bytes]]:
    valid = st.integers(low, high).map(lambda i: str(i).encode())
    bounds = st.sampled_from([low - 1, low, high, high + 1]).map(lambda i: str(i).encode())
    edges = st.sampled_from(
        [b"0", b"1", b"007", b"0" * 1023 + b"1", b"0" * 1024 + b"1", b"", b"-1", b"+1", b" 1"]
        + [b"1_0", b"1.0", "\u0663".encode(), "\u00b2".encode(), "\uff11".encode()]
        + [str(n).encode() for n in (H.MAX_INT32 + 1, H.MAX_INT64 + 1)]
    )
    digits = st.text("0123456789-+ _\u0663\u00b2", max_size=22).map(str.encode)
    return valid, bounds | bounds | edges | digits


_TOPIC_VALUES = (
    topics.map(str.encode),
    st.sampled_from([b"", b".", b"..", b"...", b"a" * 250, b"a b", b"t\n", "t\u00e9".encode()]),
)
_TEXT_VALUES = (
    st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=30).map(str.encode),
    st.sampled_from([b"", b"\xff", b"\xed\xa0\x80", b"a" * 1025, b"a" * 8192, b"a" * 8193])
    | st.sampled_from([b"a" * 1024, "\u00e9".encode() * 512, "\u00e9".encode() * 513])
    | st.binary(max_size=30)
    | st.text(max_size=30).map(lambda t: t.encode("utf-8", "surrogatepass")),
)
# header -> (valid values, doubtful values)
_RAW_VALUES: dict[str, tuple[st.SearchStrategy[bytes], st.SearchStrategy[bytes]]] = {
    H.DESTINATION: _TOPIC_VALUES,
    H.ORIGINAL_TOPIC: _TOPIC_VALUES,
    H.SEND_TO: (
        st.sampled_from([b"retry", b"dlq"]),
        st.sampled_from([b"RETRY", b"retry ", b"", b"dl", b"dlq\x00"]),
    ),
    H.RETRY_AT: _ints(0, H.MAX_INT64),
    H.DEADLINE: _ints(0, H.MAX_INT64),
    H.ORIGINAL_OFFSET: _ints(0, H.MAX_INT64),
    H.ORIGINAL_TIMESTAMP: _ints(0, H.MAX_INT64),
    H.PARTITION: _ints(0, H.MAX_INT32),
    H.ORIGINAL_PARTITION: _ints(0, H.MAX_INT32),
    H.ATTEMPT: _ints(1, H.MAX_INT32),
    H.REASON_CODE: (
        st.sampled_from([code.encode() for code in H.GIVE_UPS]),
        st.sampled_from([b"sent_to_dlq", b"", b"FATAL_ERROR", b"fatal_error "]),
    ),
    H.ID: (
        ids.map(str.encode),
        st.sampled_from([b"", b"0" * 31, b"0" * 33, b"F" * 32, b"0" * 31 + b"\n", b"-" * 32])
        | st.sampled_from([b"0" * 31 + b"\xff", "\u0663".encode() * 16, b"0" * 1025])
        | st.binary(min_size=32, max_size=32),
    ),
}
_odd_values = st.sampled_from([None, bytearray(b"1"), memoryview(b"orders"), "orders", 7])
_odd_items = st.one_of(
    st.tuples(st.sampled_from(H.ALL_HEADERS), st.sampled_from([b"1", b"orders", b"retry"])),
    st.tuples(st.sampled_from(H.ALL_HEADERS), _odd_values | st.just(_Bytes(b"1"))),
    st.sampled_from(
        [
            ("redrive-x", b"1"),
            ("redrive-", b""),
            ("Redrive-attempt", b"2"),
            (_Str(H.ATTEMPT), b"2"),
            (_Str("k"), b"v"),
            ("k", "not bytes"),
            ("a",),
            ("a", b"1", b"2"),
            [H.ATTEMPT, b"2"],
            ["k", b"v"],
            (b"redrive-attempt", b"2"),
            "ab",
            None,
        ]
    ),
)


@st.composite
def near_requests(draw: st.DrawFn) -> list[Any]:
    """Header lists around a retry request: often valid, else wrong in a few ways."""
    chosen = draw(st.sets(st.sampled_from(H.ALL_HEADERS)))
    if draw(st.integers(0, 9)):  # usually with the required headers
        chosen |= set(H.REQUIRED_HEADERS)
    headers = sorted(chosen)
    doubtful = draw(st.sets(st.sampled_from(headers), max_size=2)) if headers else set()
    items: list[Any] = []
    for header in headers:
        good, bad = _RAW_VALUES.get(header, _TEXT_VALUES)
        items.append((header, draw(bad if header in doubtful else good)))
    items += draw(st.lists(st.tuples(user_names, st.none() | st.binary(max_size=8)), max_size=3))
    items += draw(st.lists(_odd_items, max_size=1))
    return draw(st.permutations(items))


def _outcome(
    read: Callable[[Any], tuple[RetryHeaders, list[Any]]], headers: Any
) -> tuple[object, ...]:
    try:
        request, user = read(headers)
    except HeaderError as error:
        return ("error", error.header, error.problem)
    values = [getattr(request, f.name) for f in fields(request)]
    return ("ok", [(type(v), v) for v in values], [(type(h), h) for h in user])


@settings(max_examples=1000, deadline=None)
@given(near_requests())
def test_decode_answers_as_the_careful_reader(headers: list[Any]) -> None:
    expected = _outcome(D._decode_checked, headers)
    assert _outcome(decode, headers) == expected
    well_formed = all(
        type(item) is tuple
        and len(item) == 2
        and type(item[0]) is str
        and (type(item[1]) is bytes or not item[0].startswith(H.REDRIVE_PREFIX))
        for item in headers
    )
    if well_formed and expected[0] == "ok":
        assert D._decode_fast(headers) is not None  # a valid request takes the fast path


@pytest.mark.parametrize("header", sorted(INT_HEADERS))
def test_decode_bounds_integers_as_the_careful_reader(header: str) -> None:
    for number in (-1, 0, 1, H.MAX_INT32, H.MAX_INT32 + 1, H.MAX_INT64, H.MAX_INT64 + 1):
        headers = [*(pair for pair in REQUIRED if pair[0] != header), (header, b"%d" % number)]
        assert _outcome(decode, headers) == _outcome(D._decode_checked, headers)
