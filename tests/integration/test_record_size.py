"""The size a broker judges a record by (redrive.sizes.single_record_batch_size).

The Spark scheduler dead-letters a message its destination would refuse as too large,
before sending it: the computed size must be the broker's own, to the byte, or a
message that fits would be dead-lettered (or one that does not would fail the batch).
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from redrive.headers import Header
from redrive.sizes import single_record_batch_size

pytestmark = pytest.mark.integration

LIMIT = 2_000


def _produce(
    producer: Producer, topic: str, key: bytes | None, value: bytes, headers: list[Header]
) -> KafkaError | None:
    outcome: list[KafkaError | None] = []
    producer.produce(
        topic, value, key, headers=headers, on_delivery=lambda err, _msg: outcome.append(err)
    )
    producer.flush(30)
    assert len(outcome) == 1, "no delivery report"
    return outcome[0]


@pytest.mark.parametrize(
    ("key", "headers"),
    [
        (None, []),
        (b"k" * 200, []),
        (b"order-1", [("redrive-attempt", b"2"), ("trace", None), ("é-name", b"\x00" * 150)]),
    ],
)
def test_a_record_of_exactly_the_limit_is_accepted_one_byte_more_is_refused(
    bootstrap: str, key: bytes | None, headers: list[Header]
) -> None:
    topic = f"record-size-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, config={"max.message.bytes": str(LIMIT)})])[
        topic
    ].result(30)
    # One record per batch, uncompressed, as the Kafka sink sends a record this large.
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 0, "compression.type": "none"}
    )
    value_len = LIMIT - single_record_batch_size(key, b"", headers)
    while single_record_batch_size(key, b"v" * value_len, headers) > LIMIT:
        value_len -= 1  # the value's length prefix grew by a byte
    fits = b"v" * value_len
    assert single_record_batch_size(key, fits, headers) == LIMIT
    assert _produce(producer, topic, key, fits, headers) is None

    too_large = fits + b"v"
    assert single_record_batch_size(key, too_large, headers) == LIMIT + 1
    err = _produce(producer, topic, key, too_large, headers)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE
