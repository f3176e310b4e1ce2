"""The dialects of Kafka 4.4's ecosystem read without a broker: Spring's retry topics,
Kafka Streams' dead-letter queue (KIP-1034) and a share group's (KIP-1191).

Each record is built with the header names and encodings those systems write (read
from their Maven Central jars; the suite's tests against the real programs, in
tests/integration/test_neighbour_letters.py, check them on a real broker)."""

from __future__ import annotations

import struct

import pytest

from redrive.headers import Header
from redrive.reasons import DeadLetterReason as Reason
from redrive.requests import Incoming
from redrive.service.ingest import IngestedLetter, ingest, recognise

pytestmark = pytest.mark.unit

USER: list[Header] = [("trace-id", b"\x00\xffabc"), ("tenant", b"acme")]
KEY = b"order-42"
VALUE = b"fail 42"
STAMP = 1_700_000_000_123
WRAPPER = b"org.springframework.kafka.listener.ListenerExecutionFailedException"


def read(
    headers: list[Header], key: bytes | None = KEY, value: bytes | None = VALUE
) -> IngestedLetter:
    incoming = Incoming("orders-dlt", 0, 42, key, value, headers, None, STAMP)
    return ingest(incoming, "auto")


def retry_topic_hop(topic: bytes, offset: int, message: bytes, attempts: int) -> list[Header]:
    """What Spring's retry-topic publisher adds at one hop (main topic to retry topic,
    or retry topic to DLT)."""
    return [
        ("kafka_original-topic", topic),
        ("kafka_original-partition", struct.pack(">i", 1)),
        ("kafka_original-offset", struct.pack(">q", offset)),
        ("kafka_original-timestamp", struct.pack(">q", 1_700_000_000_000)),
        ("kafka_original-timestamp-type", b"CreateTime"),
        ("kafka_exception-fqcn", WRAPPER),
        ("kafka_exception-cause-fqcn", b"java.lang.IllegalStateException"),
        ("kafka_exception-message", message),
        (
            "kafka_exception-stacktrace",
            b"java.lang.IllegalStateException: boom\n\tat A.b(A.java:1)",
        ),
        ("retry_topic-attempts", struct.pack(">i", attempts)),
        ("retry_topic-backoff-timestamp", (1_700_000_001_000).to_bytes(6, "big", signed=True)),
        ("retry_topic-original-timestamp", (1_700_000_000_000).to_bytes(6, "big", signed=True)),
    ]


def test_a_spring_retry_topic_letter_names_its_first_consumption_and_its_cause() -> None:
    headers = [
        *USER,
        *retry_topic_hop(b"orders", 7, b"Listener failed; boom 1", 2),
        *retry_topic_hop(b"orders-retry", 3, b"Listener failed; boom 2", 3),
        ("kafka_dlt-original-consumer-group", b"billing"),
    ]
    result = read(headers)
    letter = result.letter
    assert result.format == "spring-retry-topic"
    assert (letter.key, letter.value, letter.headers) == (KEY, VALUE, USER)  # no Spring state
    assert letter.topic == letter.original_topic == "orders"  # the first consumption
    assert (letter.original_partition, letter.original_offset) == (1, 7)
    assert letter.original_timestamp == 1_700_000_000_000
    assert letter.group == "billing"
    assert letter.error_type == "java.lang.IllegalStateException"
    assert letter.error_message == "Listener failed; boom 2"  # the latest failure
    assert letter.attempt == 3
    assert letter.reason_code == Reason.INGESTED
    assert letter.reason == (
        "Spring Kafka retry-topic dead letter ingested from orders-dlt[0]@42: "
        "java.lang.IllegalStateException: Listener failed; boom 2"
    )
    assert "unreadable" not in letter.reason


def test_spring_retry_state_on_a_recoverers_letter_is_not_kept_either() -> None:
    # A record that went through retry topics and was then dead-lettered by a
    # DeadLetterPublishingRecoverer: read as Spring's retry topics, its kafka_dlt-
    # headers are Spring's too, none kept for a replay.
    headers = [
        *retry_topic_hop(b"orders", 7, b"first", 2),
        ("kafka_dlt-original-topic", b"orders-retry"),
        ("kafka_dlt-exception-fqcn", WRAPPER),
        *USER,
    ]
    assert read(headers).letter.headers == USER


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([("retry_topic-attempts", struct.pack(">i", 2))], "spring-retry-topic"),
        ([("kafka_original-topic", b"orders")], "spring-retry-topic"),
        ([("kafka_dlt-original-topic", b"orders")], "spring"),
        ([("__streams.errors.topic", b"orders")], "streams"),
        ([("__dlq.errors.topic", b"orders")], "share-group"),
        ([("__connect.errors.topic", b"orders")], "connect"),
        ([("kafka-not-spring", b"x")], "raw"),
    ],
)
def test_auto_recognises_the_dialect(headers: list[Header], expected: str) -> None:
    assert recognise(headers) == expected


def streams_headers(**changes: bytes | None) -> list[Header]:
    """As Kafka Streams' ExceptionHandlerUtils writes them, after the record's own."""
    headers: dict[str, bytes | None] = {
        "exception": b"java.lang.IllegalStateException",
        "message": b"boom 42",
        "stacktrace": b"java.lang.IllegalStateException: boom 42\n\tat A.b(A.java:1)",
        "topic": b"orders",
        "partition": b"2",
        "offset": b"12345",
    }
    headers.update(changes)
    return [(f"__streams.errors.{name}", value) for name, value in headers.items()]


def test_a_kafka_streams_letter_keeps_the_record_and_its_time() -> None:
    result = read([*USER, *streams_headers()])
    letter = result.letter
    assert result.format == "streams"
    assert (letter.key, letter.value, letter.headers) == (KEY, VALUE, USER)
    assert (letter.topic, letter.original_partition, letter.original_offset) == ("orders", 2, 12345)
    assert letter.original_timestamp == STAMP  # Streams keeps the record's timestamp
    assert letter.error_type == "java.lang.IllegalStateException"
    assert letter.error_message == "boom 42"
    assert letter.error_trace is not None and letter.error_trace.endswith("(A.java:1)")
    assert letter.reason == (
        "Kafka Streams dead letter ingested from orders-dlt[0]@42: "
        "java.lang.IllegalStateException: boom 42"
    )


def test_a_kafka_streams_exception_without_a_message_is_no_problem() -> None:
    letter = read(streams_headers(message=None)).letter
    assert letter.error_message is None and "unreadable" not in letter.reason


def share_group_headers(**changes: bytes | None) -> list[Header]:
    """As the broker's share-group DLQ writes them (no copy of the record)."""
    headers: dict[str, bytes | None] = {
        "topic": b"orders",
        "partition": b"1",
        "offset": b"17",
        "group": b"billing-share",
        "message": b"Offset rejected by client.",
        "delivery.count": b"1",
    }
    headers.update(changes)
    return [(f"__dlq.errors.{name}", value) for name, value in headers.items()]


def test_a_share_group_letter_without_its_record_asks_for_it() -> None:
    result = read(share_group_headers(), key=None, value=None)
    letter = result.letter
    assert result.format == "share-group" and result.needs_record
    assert (letter.topic, letter.original_partition, letter.original_offset) == ("orders", 1, 17)
    assert (letter.group, letter.attempt) == ("billing-share", 1)
    assert letter.error_type is None
    assert letter.error_message == "Offset rejected by client."
    assert letter.headers == []
    assert letter.reason == (
        "Kafka share-group dead letter (group billing-share, deliveries 1) ingested from "
        "orders-dlt[0]@42: Offset rejected by client."
    )


def test_a_share_group_letter_with_a_copy_of_its_record_needs_nothing_more() -> None:
    result = read(share_group_headers(**{"delivery.count": b"5"}))
    assert not result.needs_record
    assert (result.letter.key, result.letter.value, result.letter.attempt) == (KEY, VALUE, 5)


def test_a_share_group_letter_that_names_no_place_cannot_ask_for_its_record() -> None:
    result = read(share_group_headers(offset=b"-1"), key=None, value=None)
    assert not result.needs_record
    assert "; __dlq.errors.offset unreadable" in result.letter.reason


def test_a_connect_letter_takes_the_records_time() -> None:
    letter = read([("__connect.errors.topic", b"orders"), ("__connect.errors.offset", b"3")]).letter
    assert letter.original_timestamp == STAMP


def test_a_replayed_letter_that_comes_back_through_spring_names_its_round() -> None:
    """Spring's dead-letter publisher keeps a record's headers: a copy the retry service
    replayed keeps its round (the loop guard's) into Spring's letter."""
    replayed: list[Header] = [("redrive-replays", b"2"), ("redrive-replay-of", b"41")]
    letter = read([*USER, *replayed, *retry_topic_hop(b"orders", 7, b"boom", 3)]).letter
    assert (letter.replays, letter.replay_of) == (2, 41)
    assert read(USER).letter.replays is None
