"""How large a record redrive's producers may send: as large as the topics they read.

librdkafka refuses to produce a message above its `message.max.bytes` (1,000,000 by
default), which is below Kafka's default topic limit (1,048,588). A record a topic
accepted could then never be handed on: a retry request the service stored could not
be delivered, a record an App failed on could not be sent to its retry or dead-letter
topic, and the reader would stop or dead-letter it for a limit of its own making. So
redrive's producers take the largest limit of the topics they read, plus room for the
redrive headers and the framing around a record; the broker of the topic written to
is then the only judge of a record's size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import structlog
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

# Where the stubs see them (confluent_kafka.admin re-exports them untyped).
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType

from redrive.headers import Header

log = structlog.get_logger("redrive.kafka")

LIBRDKAFKA_DEFAULT_MAX_BYTES: Final = 1_000_000
LIBRDKAFKA_MAX_MAX_BYTES: Final = 1_000_000_000
KAFKA_DEFAULT_MAX_MESSAGE_BYTES: Final = 1_048_588
# The redrive headers (an error trace alone may be 8 KiB) and a produce request's
# framing; the setting also bounds librdkafka's produce requests as a whole.
PRODUCE_REQUEST_MARGIN: Final = 64 * 1024
RECORD_BATCH_OVERHEAD: Final = 61
"""A v2 record batch's header: offset, length, epoch, magic, CRC, attributes, last
offset delta, two timestamps, producer id and epoch, base sequence, record count."""


@dataclass(frozen=True)
class TopicLimits:
    """What a topic's broker refuses for good, read from the topic's configuration."""

    max_message_bytes: int
    """The largest record batch accepted (its own setting, else the broker's default)."""
    compacted: bool
    """``cleanup.policy`` includes ``compact``: a record without a key is refused."""


def topic_limits(
    admin: AdminClient, topics: Iterable[str], timeout_s: float = 30
) -> dict[str, TopicLimits | Exception]:
    """Each topic's :class:`TopicLimits`, or why they could not be read."""
    resources = [ConfigResource(ResourceType.TOPIC, topic) for topic in sorted(set(topics))]
    if not resources:
        return {}
    limits: dict[str, TopicLimits | Exception] = {}
    for resource, future in admin.describe_configs(resources).items():
        try:
            configs = future.result(timeout=timeout_s)
            policy = configs["cleanup.policy"].value or ""
            limits[resource.name] = TopicLimits(
                int(configs["max.message.bytes"].value), "compact" in policy.split(",")
            )
        except (KafkaException, TimeoutError, KeyError, ValueError) as exc:
            limits[resource.name] = exc
    return limits


def max_message_bytes(
    admin: AdminClient, topics: Iterable[str], timeout_s: float = 30
) -> dict[str, int | Exception]:
    """Each topic's effective `max.message.bytes` (its own, else the broker's default),
    the largest record batch the broker accepts on it; or why it could not be read."""
    return {
        topic: limit if isinstance(limit, Exception) else limit.max_message_bytes
        for topic, limit in topic_limits(admin, topics, timeout_s).items()
    }


def _varint_size(value: int) -> int:
    """Bytes of a zigzag varint, as Kafka's record format writes lengths and deltas."""
    zigzag = (value << 1) ^ (value >> 63)
    size = 1
    while zigzag >= 0x80:
        zigzag >>= 7
        size += 1
    return size


_MAX_VARINT: Final = 5  # every length and count of a record fits an int32 varint
_RECORD_FIXED_AT_MOST: Final = RECORD_BATCH_OVERHEAD + 2 * _MAX_VARINT + 1 + 10 + 3 * _MAX_VARINT


def single_record_batch_size_at_most(
    key: bytes | None, value: bytes | None, headers: Sequence[Header]
) -> int:
    """An upper bound of :func:`single_record_batch_size`, a few times cheaper: every
    varint at its longest, every character of a header name at 4 bytes. When it is
    within a limit, the exact size is too."""
    size = _RECORD_FIXED_AT_MOST + len(key or b"") + len(value or b"")
    for name, header_value in headers:
        size += 2 * _MAX_VARINT + 4 * len(name) + len(header_value or b"")
    return size


def single_record_batch_size(
    key: bytes | None, value: bytes | None, headers: Sequence[Header]
) -> int:
    """The size of a record batch holding only this record, uncompressed (Kafka's v2
    format): what a broker compares with ``max.message.bytes``. A producer sends a
    record too large to share a batch in a batch of its own, so this is the size the
    broker judges it by."""

    def field(data: bytes | None) -> int:
        return _varint_size(-1) if data is None else _varint_size(len(data)) + len(data)

    body = 1 + _varint_size(0) + _varint_size(0)  # attributes, timestamp and offset delta
    body += field(key) + field(value) + _varint_size(len(headers))
    for name, header_value in headers:
        body += field(name.encode("utf-8", "surrogatepass")) + field(header_value)
    return RECORD_BATCH_OVERHEAD + _varint_size(body) + body


def producer_size_limit(admin: AdminClient, read_topics: Iterable[str]) -> dict[str, int]:
    """`message.max.bytes` for a producer that hands on records of `read_topics`: the
    largest of their limits plus a margin. Where a limit cannot be read (no
    DescribeConfigs permission, say), Kafka's default is assumed, and said."""
    try:
        found = max_message_bytes(admin, read_topics)
    except KafkaException as exc:
        found = {topic: exc for topic in read_topics}
    limits = []
    for topic, limit in found.items():
        if isinstance(limit, Exception):
            log.warning(
                "cannot read the topic's max.message.bytes; assuming Kafka's default "
                "(set message.max.bytes in the kafka settings if the topic allows more)",
                topic=topic,
                assumed=KAFKA_DEFAULT_MAX_MESSAGE_BYTES,
                error=str(limit),
            )
            limit = KAFKA_DEFAULT_MAX_MESSAGE_BYTES
        limits.append(limit)
    largest = max(limits, default=KAFKA_DEFAULT_MAX_MESSAGE_BYTES)
    wanted = max(largest + PRODUCE_REQUEST_MARGIN, LIBRDKAFKA_DEFAULT_MAX_BYTES)
    return {"message.max.bytes": min(wanted, LIBRDKAFKA_MAX_MAX_BYTES)}
