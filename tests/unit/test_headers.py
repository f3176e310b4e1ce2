"""The header contract: encoding, strict and lenient decoding, caps, next requests."""

from __future__ import annotations

import doctest
import pickle
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redrive import header_decoding as D
from redrive import headers as H
from redrive.header_fields import INT_HEADERS
from redrive.headers import (
    ErrorInfo,
    HeaderError,
    RetryHeaders,
    cap_text,
    decode,
    describe_error,
    encode,
    next_request,
    qualified_name,
    read_delivery_headers,
    request_id,
    split_headers,
)

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parents[2] / "docs"

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

retry_headers = st.builds(
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
        "redrive-id",
        "redrive-order",
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


# ---------------------------------------------------------------- caps


@given(st.text(max_size=20_000), st.integers(20, 2000), st.sampled_from(["start", "end"]))
def test_cap_text_never_exceeds_and_is_idempotent(text: str, cap: int, keep: str) -> None:
    capped = cap_text(text, cap, keep=keep)  # type: ignore[arg-type]
    assert len(capped.encode("utf-8")) <= cap
    assert cap_text(capped, cap, keep=keep) == capped  # type: ignore[arg-type]


def test_cap_keeps_start_of_message_and_end_of_trace() -> None:
    message = cap_text("é" * 2000, H.MAX_ERROR_MESSAGE_BYTES)
    assert message.startswith("éé") and message.endswith(H.TRUNCATED_SUFFIX)
    trace = cap_text("x" * 9000 + "LAST FRAME", H.MAX_ERROR_TRACE_BYTES, keep="end")
    assert trace.startswith(H.TRUNCATED_PREFIX) and trace.endswith("LAST FRAME")
    assert len(trace.encode()) == H.MAX_ERROR_TRACE_BYTES


@given(st.text(max_size=5000), st.text(max_size=20_000))
def test_error_texts_never_exceed_caps(message: str, trace: str) -> None:
    h = RetryHeaders(destination="t", retry_at=0, error_message=message, error_trace=trace)
    encoded = dict(encode(h))
    assert len(encoded[H.ERROR_MESSAGE] or b"") <= H.MAX_ERROR_MESSAGE_BYTES
    assert len(encoded[H.ERROR_TRACE] or b"") <= H.MAX_ERROR_TRACE_BYTES


def _fail(depth: int, message: str) -> BaseException:
    def recurse(n: int) -> None:
        if n == 0:
            raise RuntimeError(message)
        recurse(n - 1)

    try:
        recurse(depth)
    except RuntimeError as error:
        return error
    raise AssertionError


@settings(max_examples=30, deadline=None)
@given(st.text(max_size=3000), st.integers(0, 80))
def test_headers_do_not_grow_with_attempts(message: str, depth: int) -> None:
    user = [("trace-id", b"abc")]
    delivered: list[tuple[str, bytes | None]] = [*user]
    sizes = []
    bound = sum(
        len(n) + c
        for n, c in [
            (H.ERROR_MESSAGE, H.MAX_ERROR_MESSAGE_BYTES),
            (H.ERROR_TRACE, H.MAX_ERROR_TRACE_BYTES),
            (H.ERROR_TYPE, 30),
        ]
    )
    for attempt in range(1, 40):
        previous = read_delivery_headers(delivered)
        request = next_request(
            previous,
            destination="orders",
            retry_at=1000 * attempt,
            error=_fail(depth, message),
            record_topic="orders",
            record_partition=0,
            record_offset=attempt,
            record_timestamp=0,
        )
        assert request.attempt == attempt
        delivered = encode(request, delivered)
        assert len([n for n, _ in delivered if n == H.ATTEMPT]) == 1
        sizes.append(sum(len(n) + len(v or b"") for n, v in delivered))
        assert decode(delivered)[1] == user
    assert max(sizes) - min(sizes) <= 2  # only the attempt number's digits may grow
    assert max(sizes) <= bound + 1000


# ---------------------------------------------------------------- lenient reader


def test_read_delivery_headers_first_delivery() -> None:
    assert read_delivery_headers(None) is None
    assert read_delivery_headers([("k", b"v")]) is None


def test_read_delivery_headers_is_lenient() -> None:
    headers = [
        *REQUIRED,
        (H.ATTEMPT, b"1"),
        (H.ATTEMPT, b"4"),  # last one wins
        ("redrive-future-header", b"?"),  # ignored
        (H.PARTITION, b"x"),  # invalid optional value dropped
        (H.GROUP, b"a" * 5000),  # too long: dropped
        (H.ERROR_MESSAGE, b"m" * 5000),  # too long: capped
        (H.ORIGINAL_OFFSET, b"42"),
        (H.ID, b"not an id"),  # invalid optional value dropped
    ]
    read = read_delivery_headers(headers)
    assert read is not None
    assert (read.attempt, read.partition, read.group, read.original_offset) == (4, None, None, 42)
    assert read.id is None
    assert read.error_message is not None
    assert len(read.error_message.encode()) <= H.MAX_ERROR_MESSAGE_BYTES
    assert read_delivery_headers([(H.DESTINATION, b"bad topic"), (H.RETRY_AT, b"1")]) is None
    bad_attempt = read_delivery_headers([*REQUIRED, (H.ATTEMPT, b"0")])
    assert bad_attempt is not None and bad_attempt.attempt == 1


# ---------------------------------------------------------------- next request


class Boom(Exception):
    pass


def test_qualified_names() -> None:
    assert qualified_name(ValueError) == "ValueError"
    assert qualified_name(Boom) == f"{__name__}.Boom"
    assert qualified_name(doctest.DocTestFailure) == "doctest.DocTestFailure"


def test_describe_error() -> None:
    try:
        raise Boom("it broke")
    except Boom as error:
        info = describe_error(error)
    assert info.type == f"{__name__}.Boom"
    assert info.message == "it broke"
    assert "Traceback" in info.trace and info.trace.rstrip().endswith("Boom: it broke")


def test_describe_error_with_broken_str() -> None:
    class Ugly(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert describe_error(Ugly()).message == "<unprintable Ugly>"


def test_next_request_first_failure() -> None:
    request = next_request(
        None,
        destination="orders.retry",
        retry_at=2000,
        deadline=9000,
        group="billing",
        error=Boom("x"),
        record_topic="orders",
        record_partition=3,
        record_offset=77,
        record_timestamp=1000,
    )
    assert request.attempt == 1
    assert (request.original_topic, request.original_partition) == ("orders", 3)
    assert (request.original_offset, request.original_timestamp) == (77, 1000)
    assert (request.error_type, request.error_message) == (f"{__name__}.Boom", "x")
    assert request.partition is None


def test_next_request_keeps_originals_and_replaces_error() -> None:
    first = next_request(
        None,
        destination="orders",
        retry_at=2000,
        deadline=9000,
        group="billing",
        error=ErrorInfo("a.First", "one", "trace one"),
        record_topic="orders",
        record_partition=3,
        record_offset=77,
        record_timestamp=1000,
    )
    second = next_request(
        first,
        destination="orders",
        retry_at=5000,
        error=("b.Second", "two", "trace two"),
        record_topic="orders.retry",
        record_partition=0,
        record_offset=5,
        record_timestamp=2000,
    )
    assert second.attempt == 2
    assert (second.original_topic, second.original_partition) == ("orders", 3)
    assert (second.original_offset, second.original_timestamp) == (77, 1000)
    assert (second.error_type, second.error_message, second.error_trace) == (
        "b.Second",
        "two",
        "trace two",
    )
    assert (second.deadline, second.group) == (9000, "billing")  # inherited
    third = next_request(second, destination="orders", retry_at=1, error=Boom(), deadline=1)
    assert third.deadline == 1


def test_next_request_caps_error_texts() -> None:
    request = next_request(None, destination="t", retry_at=0, error=("T", "m" * 5000, "t" * 50_000))
    assert decode(encode(request))[0] == request
    assert request.error_message is not None and request.error_trace is not None
    assert len(request.error_message) <= H.MAX_ERROR_MESSAGE_BYTES
    assert len(request.error_trace) <= H.MAX_ERROR_TRACE_BYTES


# ---------------------------------------------------------------- request ids


def _request(**fields: object) -> RetryHeaders:
    values: dict[str, object] = {
        "destination": "orders",
        "retry_at": 2000,
        "attempt": 2,
        "group": "billing",
        "original_topic": "orders",
        "original_partition": 3,
        "original_offset": 77,
    }
    values.update(fields)
    return RetryHeaders(**values)  # type: ignore[arg-type]


def test_request_id_is_the_same_for_the_same_failure() -> None:
    # A hand-off repeated after a crash writes the request again, later and maybe with
    # another error text or deadline: the same failure, so the same id.
    first = request_id(_request())
    assert first == request_id(
        _request(retry_at=9000, deadline=9999, error_message="other", original_timestamp=5)
    )
    assert len(first) == H.ID_LENGTH and set(first) <= set("0123456789abcdef")
    assert decode(encode(replace(_request(), id=first)))[0].id == first


@pytest.mark.parametrize(
    "change",
    [
        {"attempt": 3},  # the next retry of the record is a new request
        {"original_offset": 78},
        {"original_partition": 4},
        {"original_topic": "payments"},
        {"group": "shipping"},
        {"group": None},
    ],
)
def test_request_id_differs_for_another_failure(change: dict[str, object]) -> None:
    assert request_id(_request(**change)) != request_id(_request())


def test_a_dead_letter_has_its_failures_id_and_a_release_its_own() -> None:
    # One failure handed off as a retry before a crash and as a dead letter after it is
    # one failure; the release of a retry is another message than that retry.
    retry = _request()
    assert request_id(replace(retry, send_to="dlq", reason="spent")) == request_id(retry)
    release = replace(retry, order="release")
    assert request_id(release) != request_id(retry)
    assert request_id(release) == request_id(replace(release, retry_at=12_345))
    behind = replace(retry, attempt=0, order="behind")
    assert request_id(behind) not in (request_id(retry), request_id(release))


def test_request_id_fields_do_not_run_together() -> None:
    # A group name that contains what a naive join would put between the fields.
    a = _request(group="a.b", original_topic="c")
    b = _request(group="a", original_topic="b.c")
    assert request_id(a) != request_id(b)


def test_replace_revalidates() -> None:
    h = RetryHeaders(destination="t", retry_at=0)
    with pytest.raises(HeaderError):
        replace(h, attempt=0)


# ---------------------------------------------------------------- docs


def test_docs_examples_run() -> None:
    failures, tried = doctest.testfile(
        str(DOCS / "headers.md"), module_relative=False, optionflags=doctest.ELLIPSIS
    )
    assert tried > 0
    assert failures == 0


# ---------------------------------------------------------------- key order


@pytest.mark.parametrize("order", ["behind", "release"])
def test_a_record_not_failed_yet_has_attempt_0_only_in_a_key_queue(order: str) -> None:
    # A record behind its key's head was never handled: nothing failed, attempt 0.
    h = RetryHeaders(destination="orders", retry_at=5, attempt=0, order=order)  # type: ignore[arg-type]
    assert decode(encode(h))[0] == h
    with pytest.raises(HeaderError, match=H.ATTEMPT):
        RetryHeaders(destination="orders", retry_at=5, attempt=0)
    with pytest.raises(HeaderError, match=H.ATTEMPT):
        RetryHeaders(destination="orders", retry_at=5, attempt=0, order="key")
    with pytest.raises(HeaderError, match=H.ATTEMPT):
        decode([(H.DESTINATION, b"orders"), (H.RETRY_AT, b"5"), (H.ATTEMPT, b"0")])


def test_an_unknown_order_is_refused_and_named() -> None:
    with pytest.raises(HeaderError, match=H.ORDER):
        decode([(H.DESTINATION, b"orders"), (H.RETRY_AT, b"5"), (H.ORDER, b"partition")])
    # The lenient reader drops it, and the attempt it would have allowed.
    delivery = read_delivery_headers(
        [(H.DESTINATION, b"orders"), (H.RETRY_AT, b"5"), (H.ATTEMPT, b"0"), (H.ORDER, b"x")]
    )
    assert delivery is not None
    assert (delivery.order, delivery.attempt) == (None, 1)
