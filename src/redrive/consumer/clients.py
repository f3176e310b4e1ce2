"""The App's Kafka clients, configured for what redrive's guarantees rest on.

The consumer never commits on its own (``enable.auto.commit`` and
``enable.auto.offset.store`` off, whatever the user's settings): the App commits only
past records dealt with. The producer is idempotent and takes the largest size limit
of the topics the App reads, so that a record a topic accepted can be handed to its
retry or dead-letter topic (see :mod:`redrive.sizes`), and places what it writes by
key as the App's ``partitioner`` says (see :mod:`redrive.partitioners`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from redrive.errors import ConfigError
from redrive.partitioners import Partitioner, partitioner_named, placed_by, raw_partitioner
from redrive.sizes import producer_size_limit

PARTITIONER_SETTING = "App(partitioner=...)"


def make_consumer(
    config: Mapping[str, Any],
    consumer_kafka: Mapping[str, Any],
    group: str,
    on_commit: Callable[[KafkaError | None, list[TopicPartition]], None],
) -> Consumer:
    return Consumer(
        {
            # Defaults the user's `kafka` settings may override...
            "auto.offset.reset": "earliest",
            # A resumed partition joins the next fetch request only when the one in
            # flight returns; librdkafka's default long poll (500 ms) would make an
            # in-place retry up to that late (measured: 200 ms retries came after a
            # median of 307 ms, max 506; with 50 ms: 214 and 296).
            "fetch.wait.max.ms": 50,
            # While the local queue is full of a backlog, librdkafka fetches no
            # partition, a retry topic's neither, and checks again only after this
            # (default 1 s): a retry due now would come back up to a second late.
            "fetch.queue.backoff.ms": 50,
            **config,
            **consumer_kafka,
            # ...and what redrive's guarantees rest on, which they may not.
            "group.id": group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # Hand-offs of transactions not committed (yet, or ever) are not records.
            "isolation.level": "read_committed",
            "on_commit": on_commit,
        }
    )


def chosen_partitioner(partitioner: object, kafka: Mapping[str, Any]) -> Partitioner:
    """The App's partitioner, given once: as ``partitioner``, never in ``kafka``."""
    if (raw := raw_partitioner(kafka)) is not None:
        raise ConfigError(
            "App(kafka=...)",
            f"names librdkafka's {raw!r}, which App(partitioner=...) chooses",
            f"leave it out of kafka and pass {PARTITIONER_SETTING}",
        )
    return partitioner_named(partitioner, PARTITIONER_SETTING)


def make_producer(
    admin: AdminClient,
    config: Mapping[str, Any],
    reads: Iterable[str],
    partitioner: Partitioner,
    transactional_id: str | None = None,
) -> Producer:
    """``transactional_id``: the App hands off in transactions
    (:mod:`redrive.consumer.transactions`)."""
    # As large as what it reads; the user's `kafka` settings may say more.
    size_limit = producer_size_limit(admin, reads)
    transactional = {} if transactional_id is None else {"transactional.id": transactional_id}
    return Producer(
        {
            **size_limit,
            **config,
            "enable.idempotence": True,
            "linger.ms": 5,
            **placed_by(partitioner),
            **transactional,
        }
    )
