"""Messages with redrive headers travel through the real broker byte for byte."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Producer

from redrive.headers import RetryHeaders, decode, encode

pytestmark = pytest.mark.integration

ALL_BYTES = bytes(range(256))


def produce_and_read_back(
    bootstrap: str, topic: str, records: list[dict[str, object]]
) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]]:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for record in records:
        producer.produce(topic, **record)  # type: ignore[arg-type]
    assert producer.flush(30) == 0
    producer.close()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"roundtrip-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    received = []
    try:
        while len(received) < len(records):
            msg = consumer.poll(10)
            assert msg is not None, f"only {len(received)} of {len(records)} came back"
            assert msg.error() is None, msg.error()
            received.append((msg.key(), msg.value(), list(msg.headers() or [])))
    finally:
        consumer.close()
    return received


def test_binary_payloads_null_keys_and_values_and_headers_survive(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("roundtrip")
    request = RetryHeaders(
        destination="orders",
        retry_at=1_767_225_600_123,
        attempt=3,
        partition=2,
        deadline=1_767_229_200_000,
        group="billing",
        original_topic="orders",
        original_partition=2,
        original_offset=41,
        original_timestamp=1_767_225_000_000,
        error_type="billing.errors.Unavailable",
        error_message="payment gateway said 503 — retry later",
        error_trace="Traceback (most recent call last):\n  ...\nUnavailable: 503",
    )
    user_headers: list[tuple[str, bytes | None]] = [
        ("trace-id", b"4bf92f3577b34da6"),
        ("binary", ALL_BYTES),
        ("empty", b""),
        ("null", None),
        ("trace-id", b"second value of a repeated user header"),
    ]
    records: list[dict[str, object]] = [
        {"key": ALL_BYTES, "value": ALL_BYTES[::-1], "headers": encode(request, user_headers)},
        {"key": None, "value": b"\x00\x01 null key", "headers": encode(request)},
        {"key": b"tombstone", "value": None, "headers": encode(request, user_headers)},
        {"key": b"", "value": b"", "headers": []},
    ]
    received = produce_and_read_back(bootstrap, topic, records)

    for sent, (key, value, headers) in zip(records, received, strict=True):
        assert key == sent["key"]
        assert value == sent["value"]
        sent_headers = sent["headers"]
        assert headers == [(k, v) for k, v in sent_headers]  # type: ignore[attr-defined]
    decoded, users = decode(received[0][2])
    assert decoded == request
    assert users == user_headers
    decoded_tombstone, _ = decode(received[2][2])
    assert decoded_tombstone == request
    assert decode(received[1][2]) == (request, [])
