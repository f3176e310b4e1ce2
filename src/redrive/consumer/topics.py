"""Creating the topics a consumer app derives from its handlers' topics.

Invariant: when :func:`create_derived_topics` returns, every topic it created is in
the broker's metadata. A topic is created by the controller and known to the
brokers a moment later; a consumer that subscribes in that moment is told the topic
does not exist, and librdkafka looks again only at its next metadata refresh
(``topic.metadata.refresh.interval.ms``, five minutes): the App would not read its
retries for that long.
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from redrive.consumer.co_partitioned import check_partition_count
from redrive.consumer.routes import Route
from redrive.errors import ConfigError

log = structlog.get_logger("redrive.consumer")


def create_derived_topics(admin: AdminClient, routes: list[Route]) -> None:
    """Create missing tier, per-group and dead-letter topics with their source's
    partition count. The source topics themselves must exist."""
    try:
        metadata = admin.list_topics(timeout=15)
    except KafkaException as exc:
        raise ConfigError(
            "bootstrap",
            f"cannot read topic metadata: {exc}",
            "check that the broker is reachable and the kafka settings",
        ) from None
    wanted: list[NewTopic] = []
    for route in routes:
        source = metadata.topics.get(route.topic)
        if source is None or source.error is not None:
            raise ConfigError(
                f"topic {route.topic!r}",
                "does not exist",
                "create it first: its retry and dead-letter topics copy its partition count",
            )
        partitions = len(source.partitions)
        if route.ordering is not None:  # a key's retries come back to its instance
            for name, kind in route.topics().items():
                there = metadata.topics.get(name)
                if kind != "source" and there is not None and there.error is None:
                    check_partition_count(route.topic, partitions, name, len(there.partitions))
        wanted += [
            NewTopic(
                name,
                num_partitions=partitions,
                # One record per held key is what matters: compaction keeps the last.
                config={"cleanup.policy": "compact"} if name == route.held_topic else {},
            )
            for name in route.topics_to_create()
            if name not in metadata.topics
        ]
    if not wanted:
        return
    for name, future in admin.create_topics(wanted).items():
        try:
            future.result(timeout=30)
            log.info("topic created", topic=name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise ConfigError(
                    f"topic {name!r}",
                    f"cannot be created: {exc}",
                    "create it yourself, or grant the app CREATE on it",
                ) from None
    _wait_until_known(admin, [topic.topic for topic in wanted])


def _wait_until_known(admin: AdminClient, names: list[str], timeout_s: float = 30.0) -> None:
    """Wait until the broker's metadata has each topic with its partitions (see the
    module); past ``timeout_s``, go on and say so (the subscription still finds them
    at the next refresh)."""
    deadline = time.monotonic() + timeout_s
    missing = list(names)
    while missing:
        try:
            topics = admin.list_topics(timeout=5).topics
        except KafkaException:
            topics = {}
        missing = [
            name
            for name in missing
            if (known := topics.get(name)) is None
            or known.error is not None
            or not known.partitions
        ]
        if not missing:
            return
        if time.monotonic() >= deadline:
            log.warning(
                "topics created but not in the broker's metadata yet; they are read once "
                "the consumer refreshes its metadata",
                topics=missing,
                waited_s=timeout_s,
            )
            return
        time.sleep(0.1)


def _known(topic: Any) -> bool:
    # confluent-kafka does not export its TopicMetadata type.
    return topic is not None and topic.error is None and bool(topic.partitions)
