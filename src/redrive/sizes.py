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

from collections.abc import Iterable
from typing import Final

import structlog
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

# Where the stubs see them (confluent_kafka.admin re-exports them untyped).
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType

log = structlog.get_logger("redrive.kafka")

LIBRDKAFKA_DEFAULT_MAX_BYTES: Final = 1_000_000
LIBRDKAFKA_MAX_MAX_BYTES: Final = 1_000_000_000
KAFKA_DEFAULT_MAX_MESSAGE_BYTES: Final = 1_048_588
# The redrive headers (an error trace alone may be 8 KiB) and a produce request's
# framing; the setting also bounds librdkafka's produce requests as a whole.
PRODUCE_REQUEST_MARGIN: Final = 64 * 1024


def max_message_bytes(
    admin: AdminClient, topics: Iterable[str], timeout_s: float = 30
) -> dict[str, int | Exception]:
    """Each topic's effective `max.message.bytes` (its own, else the broker's default),
    the largest record batch the broker accepts on it; or why it could not be read."""
    resources = [ConfigResource(ResourceType.TOPIC, topic) for topic in sorted(set(topics))]
    if not resources:
        return {}
    limits: dict[str, int | Exception] = {}
    for resource, future in admin.describe_configs(resources).items():
        try:
            configs = future.result(timeout=timeout_s)
            limits[resource.name] = int(configs["max.message.bytes"].value)
        except (KafkaException, TimeoutError, KeyError, ValueError) as exc:
            limits[resource.name] = exc
    return limits


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
