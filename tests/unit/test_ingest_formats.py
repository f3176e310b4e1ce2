"""Records of foreign dead-letter topics as redrive dead letters (ingest), without a broker.

Each format's record is built with the headers its system writes: Spring Kafka's
``DeadLetterRecordManager`` (partition a 4-byte int, offset and timestamp 8-byte longs,
big-endian; the rest UTF-8), Kafka Connect's ``DeadLetterQueueReporter`` (UTF-8 text,
numbers in decimal), and redrive's own App and service (the real router and encoder).
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redrive.headers import (
    ALL_HEADERS,
    DEAD_LETTER_REASON,
    MAX_ERROR_MESSAGE_BYTES,
    MAX_ERROR_TRACE_BYTES,
    MAX_VALUE_BYTES,
    Header,
    RetryHeaders,
    encode,
)
from redrive.policy import FatalError, policy
from redrive.reasons import DeadLetterReason as Reason
from redrive.records import RequestCoordinates
from redrive.requests import Incoming
from redrive.router import FailedRecord, Router
from redrive.service.ingest import DIALECTS, FORMATS, Format, IngestedLetter, ingest
from redrive.service.ingest.connect import PREFIX as CONNECT_PREFIX
from redrive.service.ingest.spring import PREFIX as SPRING_PREFIX

pytestmark = pytest.mark.unit

NOW = 1_800_000_000_000
USER: list[Header] = [("trace-id", b"\x00\xffabc"), ("tenant", b"acme"), ("empty", None)]
KEY = b"order-42"
VALUE = b'{"id": 42, "note": "\xc3\xa9t\xc3\xa9"}'


def read(
    headers: list[Header], format: Format = "auto", problem: str | None = None
) -> IngestedLetter:
    return ingest(Incoming("orders-dlt", 0, 42, KEY, VALUE, headers, problem), format)


def spring(**changes: bytes | None) -> list[Header]:
    """As DeadLetterRecordManager writes them: exception info, then the originals."""
    headers = {
        "exception-fqcn": b"org.springframework.kafka.listener.ListenerExecutionFailedException",
        "exception-cause-fqcn": b"java.lang.IllegalStateException",
        "exception-message": b"Listener failed; bad item",
        "exception-stacktrace": b"java.lang.IllegalStateException: bad item\n\tat A.b(A.java:1)",
        "original-topic": b"orders",
        "original-partition": struct.pack(">i", 3),
        "original-offset": struct.pack(">q", 12345),
        "original-timestamp": struct.pack(">q", 1_700_000_000_000),
        "original-timestamp-type": b"CreateTime",
        "original-consumer-group": b"billing",
    }
    headers.update(changes)
    return [(SPRING_PREFIX + name, value) for name, value in headers.items()]


def connect(**changes: bytes | None) -> list[Header]:
    """As Kafka Connect's DeadLetterQueueReporter writes them (context headers on)."""
    headers = {
        "topic": b"orders",
        "partition": b"2",
        "offset": b"12345",
        "connector.name": b"jdbc-sink",
        "task.id": b"0",
        "stage": b"VALUE_CONVERTER",
        "class.name": b"org.apache.kafka.connect.json.JsonConverter",
        "exception.class.name": b"org.apache.kafka.connect.errors.DataException",
        "exception.message": b"Converting byte[] to Kafka Connect data failed",
        "exception.stacktrace": b"org.apache.kafka.connect.errors.DataException: ...",
    }
    headers.update(changes)
    return [(CONNECT_PREFIX + name.replace("_", "."), value) for name, value in headers.items()]


def app_dead_letter() -> list[Header]:
    """As an App writes a dead letter to <topic>.dlq: the router's headers, encoded."""
    router = Router(policy("1s x3"), "billing", clock=lambda: NOW)
    record = FailedRecord("orders", 2, 12345, NOW - 10, KEY, VALUE, USER, None, 1)
    outcome = router.route(
        record, FatalError("bad item"), retry_to=None, dead_letters="orders.dlq", home="orders"
    )
    return encode(outcome.headers, USER)  # as the consumer's publisher does


def test_a_spring_dead_letter_keeps_its_origin_error_and_user_headers() -> None:
    result = read([*USER[:2], *spring(), USER[2]])
    letter = result.letter
    assert result.format == "spring"
    assert (letter.key, letter.value, letter.headers) == (KEY, VALUE, USER)
    assert letter.topic == letter.original_topic == "orders"
    assert (letter.original_partition, letter.original_offset) == (3, 12345)
    assert letter.original_timestamp == 1_700_000_000_000
    assert letter.group == "billing"
    # The root cause's class, not the wrapper's: what operators search by.
    assert letter.error_type == "java.lang.IllegalStateException"
    assert letter.error_message == "Listener failed; bad item"
    assert letter.error_trace is not None and letter.error_trace.endswith("(A.java:1)")
    assert letter.attempt is None
    assert letter.reason_code == Reason.INGESTED
    assert letter.reason == (
        "Spring Kafka dead letter ingested from orders-dlt[0]@42: "
        "java.lang.IllegalStateException: Listener failed; bad item"
    )
    assert letter.source == "ingest:spring"
    assert letter.request == RequestCoordinates("orders-dlt", 0, 42)


def test_a_spring_key_that_did_not_deserialize_names_its_own_exception() -> None:
    headers = [
        (
            f"{SPRING_PREFIX}key-exception-fqcn",
            b"o.s.k.support.serializer.DeserializationException",
        ),
        (f"{SPRING_PREFIX}key-exception-message", b"failed to deserialize key"),
        (f"{SPRING_PREFIX}key-exception-stacktrace", b"trace"),
        *spring()[4:],  # the originals, no value exception
    ]
    letter = read(headers).letter
    assert letter.error_type == "o.s.k.support.serializer.DeserializationException"
    assert (letter.error_message, letter.error_trace) == ("failed to deserialize key", "trace")


def test_spring_dead_lettered_twice_the_first_origin_and_the_last_error_count() -> None:
    # A DLT record consumed and dead-lettered again: Spring appends a second set of
    # originals (appendOriginalHeaders) and, keeping old exceptions, the new ones last.
    again = spring(**{"original-topic": b"orders-dlt", "exception-message": b"second"})
    letter = read([*spring(), *again]).letter
    assert (letter.topic, letter.original_topic) == ("orders", "orders")
    assert letter.error_message == "second"
    assert letter.headers == []


def test_spring_values_that_do_not_decode_are_dropped_and_named() -> None:
    headers = spring(
        **{
            "original-topic": b"not a topic!",
            "original-partition": struct.pack(">q", 3),  # a long, not an int
            "original-offset": struct.pack(">q", -5),
            "original-consumer-group": b"\xff\xfe",
            "exception-message": None,  # Spring writes none for a null message
        }
    )
    letter = read(headers).letter
    assert letter.topic is letter.original_topic is None
    assert letter.original_partition is letter.original_offset is letter.group is None
    assert letter.error_message is None
    assert letter.original_timestamp == 1_700_000_000_000
    for name in ("topic", "partition", "offset", "consumer-group"):
        assert f"; kafka_dlt-original-{name} unreadable" in letter.reason
    assert "exception-message" not in letter.reason


def test_spring_no_timestamp_is_none_and_not_a_problem() -> None:
    letter = read(spring(**{"original-timestamp": struct.pack(">q", -1)})).letter
    assert letter.original_timestamp is None
    assert "unreadable" not in letter.reason


def test_error_texts_are_capped_as_a_request_caps_them() -> None:
    headers = spring(
        **{
            "exception-message": "é".encode() * MAX_ERROR_MESSAGE_BYTES,
            "exception-stacktrace": b"t" * (MAX_ERROR_TRACE_BYTES * 2) + b"last frame",
            "exception-fqcn": b"x" * (MAX_VALUE_BYTES + 1),
        }
    )
    letter = read(headers).letter
    assert letter.error_message is not None and letter.error_trace is not None
    assert len(letter.error_message.encode()) <= MAX_ERROR_MESSAGE_BYTES
    assert len(letter.error_trace.encode()) <= MAX_ERROR_TRACE_BYTES
    assert letter.error_trace.endswith("last frame")
    assert letter.error_type is not None and len(letter.error_type) <= MAX_VALUE_BYTES
    assert len(letter.reason) < 1000


def test_a_connect_dead_letter_keeps_its_origin_error_and_context() -> None:
    result = read([*connect(), *USER])
    letter = result.letter
    assert result.format == "connect"
    assert letter.headers == USER
    assert letter.topic == letter.original_topic == "orders"
    assert (letter.original_partition, letter.original_offset) == (2, 12345)
    assert letter.original_timestamp is letter.group is letter.attempt is None
    assert letter.error_type == "org.apache.kafka.connect.errors.DataException"
    assert letter.error_message == "Converting byte[] to Kafka Connect data failed"
    assert letter.error_trace == "org.apache.kafka.connect.errors.DataException: ..."
    assert letter.reason == (
        "Kafka Connect dead letter (connector jdbc-sink, task 0, stage VALUE_CONVERTER) "
        "ingested from orders-dlt[0]@42: org.apache.kafka.connect.errors.DataException: "
        "Converting byte[] to Kafka Connect data failed"
    )
    assert (letter.reason_code, letter.source) == (Reason.INGESTED, "ingest:connect")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("offset", b"12a"),
        ("offset", b"-1"),
        ("offset", b" 12"),
        ("offset", b"9" * 30),
        ("partition", b"2147483648"),
        ("partition", "٣".encode()),  # a digit, but not an ASCII one
        ("topic", b".."),
        ("topic", b"\xc3"),
    ],
)
def test_connect_values_that_do_not_decode_are_dropped_and_named(name: str, value: bytes) -> None:
    letter = read(connect(**{name: value})).letter
    assert getattr(letter, f"original_{name}") is None
    assert f"; __connect.errors.{name} unreadable" in letter.reason


def test_an_apps_dead_letter_is_read_with_the_redrive_contract() -> None:
    headers = app_dead_letter()
    result = read(headers)
    letter = result.letter
    assert result.format == "redrive"
    assert letter.headers == USER  # the user's, byte for byte, no redrive- ones
    assert letter.topic == "orders"  # the App's home topic: where a replay goes
    assert (letter.original_topic, letter.original_partition) == ("orders", 2)
    assert (letter.original_offset, letter.original_timestamp) == (12345, NOW - 10)
    assert (letter.group, letter.attempt) == ("billing", 1)
    assert letter.error_type == "redrive.policy.FatalError"
    assert letter.error_message == "bad item"
    assert letter.reason_code == Reason.FATAL_ERROR  # its redrive-reason-code
    assert letter.reason.startswith("redrive dead letter ingested from orders-dlt[0]@42: fatal")
    assert "unreadable" not in letter.reason
    assert letter.source == "ingest:redrive"


def test_a_dead_letter_mirrored_by_the_service_keeps_its_reason() -> None:
    request = encode(RetryHeaders(destination="secret", retry_at=NOW, attempt=2), USER)
    text = "destination not allowed: 'secret' is not in the allowlist"
    letter = read([*request, (DEAD_LETTER_REASON, text.encode())]).letter
    assert (letter.topic, letter.attempt, letter.headers) == ("secret", 2, USER)
    assert letter.reason_code == Reason.INGESTED  # a text, not a code
    assert letter.reason.endswith(f"orders-dlt[0]@42: {text}")


def test_a_dead_letter_reason_naming_a_code_is_that_code() -> None:
    letter = read([*app_dead_letter(), (DEAD_LETTER_REASON, b"deadline_passed")]).letter
    assert letter.reason_code == Reason.DEADLINE_PASSED


def test_redrive_headers_that_do_not_decode_are_dropped_and_named() -> None:
    headers = [
        ("redrive-destination", b"no such topic!"),
        ("redrive-attempt", b"0"),
        ("redrive-original-topic", b"orders"),
        ("redrive-original-offset", b"-3"),
        ("redrive-send-to", b"dlq"),
        ("redrive-dead-letter-reason", b"\xff"),
    ]
    letter = read(headers).letter
    assert letter.topic == "orders"  # no usable destination: its original topic
    assert letter.attempt is letter.original_offset is None
    assert letter.reason_code == Reason.SENT_TO_DLQ
    for name in ("destination", "attempt", "original-offset", "dead-letter-reason"):
        assert f"; redrive-{name} unreadable" in letter.reason


def test_a_record_without_metadata_is_raw_with_nowhere_to_go() -> None:
    result = read(list(USER))
    assert result.format == "raw"
    letter = result.letter
    assert (letter.topic, letter.original_topic, letter.error_type) == (None, None, None)
    assert letter.headers == USER
    assert letter.reason == "record without dead-letter metadata ingested from orders-dlt[0]@42"
    assert (letter.reason_code, letter.source) == (Reason.INGESTED, "ingest:raw")


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([*USER, *spring()], "spring"),
        ([*connect(), *USER], "connect"),
        (app_dead_letter(), "redrive"),
        (USER, "raw"),
        ([], "raw"),
        ([*app_dead_letter(), ("kafka_dlt-original-topic", b"x")], "spring"),
    ],
)
def test_auto_recognises_each_format(headers: list[Header], expected: str) -> None:
    assert read(headers).format == expected


def test_a_forced_format_keeps_other_metadata_as_user_headers() -> None:
    result = read([*connect(), *USER], "spring")
    assert result.format == "spring"
    letter = result.letter
    assert letter.headers == [*connect(), *USER]
    assert (letter.topic, letter.original_offset, letter.error_type) == (None, None, None)
    assert letter.source == "ingest:spring"
    assert letter.reason.startswith("record without kafka_dlt- headers ingested from")


def test_a_spring_letter_without_its_origin_says_what_is_missing_and_what_reads_it() -> None:
    unplaced = read(spring(**{"original-topic": None, "original-offset": None}), "spring")
    assert unplaced.letter.reason.startswith(
        "Spring Kafka dead letter without kafka_dlt-original-topic, "
        "kafka_dlt-original-offset (where its record was first consumed is unknown) "
        "ingested from orders-dlt[0]@42"
    )
    # A @RetryableTopic DLT read with format spring: its origin is under kafka_original-.
    retry_topic = [
        ("kafka_original-topic", b"orders"),
        ("kafka_original-partition", struct.pack(">i", 1)),
        ("kafka_original-offset", struct.pack(">q", 7)),
        ("kafka_exception-fqcn", b"java.lang.IllegalStateException"),
        ("kafka_dlt-original-consumer-group", b"billing"),
    ]
    reason = read(retry_topic, "spring").letter.reason
    assert "without kafka_dlt-original-topic, kafka_dlt-original-partition" in reason
    assert "read that topic with format spring-retry-topic" in reason
    assert "without" not in read(spring(), "spring").letter.reason


def test_a_header_problem_is_in_the_reason() -> None:
    letter = read(spring(), problem="header 3 has a non-UTF-8 name").letter
    assert letter.reason.endswith("; headers partly unreadable: header 3 has a non-UTF-8 name")


METADATA_NAMES = [
    *(SPRING_PREFIX + n for n in ("original-topic", "original-partition", "original-offset")),
    *(SPRING_PREFIX + n for n in ("original-timestamp", "exception-fqcn", "exception-message")),
    *(SPRING_PREFIX + n for n in ("key-exception-fqcn", "exception-stacktrace")),
    *(CONNECT_PREFIX + n for n in ("topic", "partition", "offset", "task.id", "stage")),
    *(CONNECT_PREFIX + n for n in ("exception.message", "exception.stacktrace")),
    *("kafka_original-topic", "kafka_original-offset", "kafka_exception-cause-fqcn"),
    *("retry_topic-attempts", "retry_topic-original-timestamp"),
    *("__streams.errors.topic", "__streams.errors.offset", "__streams.errors.exception"),
    *("__dlq.errors.topic", "__dlq.errors.partition", "__dlq.errors.delivery.count"),
    *ALL_HEADERS,
    DEAD_LETTER_REASON,
]
names = st.one_of(st.sampled_from(METADATA_NAMES), st.text(max_size=30))
values = st.one_of(
    st.none(),
    st.binary(max_size=20),
    st.sampled_from([b"orders", b"0", b"7", b"dlq", b"-1", struct.pack(">i", 3)]),
    st.integers(-(2**63), 2**63 - 1).map(lambda n: struct.pack(">q", n)),
    st.integers(0, 2**70).map(lambda n: str(n).encode()),
    st.text(max_size=20).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"x" * (MAX_ERROR_TRACE_BYTES + 5), "é".encode() * 2000]),
)
METADATA = {dialect.name: dialect.is_metadata for dialect in DIALECTS}


@settings(max_examples=300, deadline=None)
@given(
    headers=st.lists(st.tuples(names, values), max_size=12),
    key=st.none() | st.binary(max_size=10),
    value=st.none() | st.binary(max_size=10),
    problem=st.none() | st.text(max_size=10),
)
def test_ingest_never_raises_and_keeps_the_record(
    headers: list[Header], key: bytes | None, value: bytes | None, problem: str | None
) -> None:
    incoming = Incoming("dlq", 1, 7, key, value, headers, problem)
    for format in FORMATS:
        result = ingest(incoming, format)
        letter = result.letter
        assert format in ("auto", result.format)
        is_meta = METADATA[result.format]
        assert letter.headers == [(n, v) for n, v in headers if not is_meta(n)]
        assert all(
            a is b
            for a, b in zip(letter.headers, [h for h in headers if not is_meta(h[0])], strict=True)
        )
        assert letter.key is key and letter.value is value
        assert letter.request == RequestCoordinates("dlq", 1, 7)
        assert letter.source == f"ingest:{result.format}"
        for text, cap in (
            (letter.error_message, MAX_ERROR_MESSAGE_BYTES),
            (letter.error_trace, MAX_ERROR_TRACE_BYTES),
            (letter.error_type, MAX_VALUE_BYTES),
            (letter.group, MAX_VALUE_BYTES),
        ):
            assert text is None or len(text.encode()) <= cap
        for number in (letter.original_partition, letter.original_offset, letter.attempt):
            assert number is None or number >= 0
        if problem is not None:
            assert "headers partly unreadable" in letter.reason
