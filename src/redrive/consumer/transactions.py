"""The exactly-once hand-off: retries, dead letters and offsets in one Kafka transaction.

Without it, the App produces a hand-off (a retry request, a tier record, a dead
letter), waits for the broker, then commits the source offset: a crash in between
hands the same failure off again on restart. With ``App(transactional=True)`` the
producer is transactional, and each commit of the App is one transaction holding
every hand-off since the previous commit *and* the offsets past the records dealt
with (``send_offsets_to_transaction``, with the consumer's group metadata, so that a
zombie instance of an older group generation is fenced: KIP-447). Readers of the
retry path read committed records only (librdkafka's default ``isolation.level``,
which the App's tier consumer and the retry service's intake keep): a hand-off of
an aborted or unfinished transaction is never seen.

Invariant: a hand-off is visible to readers if and only if the offset past its
record is committed. What the handlers did is still at least once: after a crash or
an aborted transaction the records since the last commit are handled again, and
their hand-offs made again, in a new transaction.

A transaction the broker cannot commit for a passing reason is retried; one that
must be aborted is, and the App rewinds every partition to its committed offset
(:meth:`redrive.consumer.app.App`); a fatal error (fenced by a newer instance with the
same ``transactional.id``) stops the App.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import structlog
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from redrive.transactional import TIMEOUT_S, retry_transactional

log = structlog.get_logger("redrive.consumer")


def transactional_id(group: str, instance_id: str | None) -> str:
    """The producer's ``transactional.id``: stable for a static member (its
    ``instance_id``), so that a restarted instance aborts at once what its previous
    run left open instead of leaving read-committed readers behind it until the
    transaction times out; unique per run otherwise (KIP-447 fences zombies by group
    generation, not by this id)."""
    suffix = instance_id if instance_id is not None else uuid.uuid4().hex
    return f"redrive.{group}.{suffix}"


class Aborted(Exception):
    """The transaction was aborted: its hand-offs are gone, its offsets not committed."""


class Transactions:
    """The App's transactional producer: one open transaction at a time."""

    def __init__(self, producer: Producer, consumer: Consumer) -> None:
        self._producer = producer
        self._consumer = consumer
        producer.init_transactions(TIMEOUT_S)
        producer.begin_transaction()

    def commit(self, offsets: list[TopicPartition]) -> None:
        """Commit the open transaction with ``offsets`` (the positions past the records
        dealt with), and open the next. Raises :class:`Aborted` when it had to be
        aborted, KafkaException on a fatal error."""
        producer = self._producer
        try:
            if offsets:
                group = self._consumer.consumer_group_metadata()
                self._retry(lambda: producer.send_offsets_to_transaction(offsets, group, TIMEOUT_S))
            self._retry(lambda: producer.commit_transaction(TIMEOUT_S))
        except KafkaException as exc:
            error = exc.args[0]
            if error.fatal() or not error.txn_requires_abort():
                raise
            log.warning("transaction aborted; rewinding to committed offsets", error=error.str())
            producer.abort_transaction(TIMEOUT_S)
            producer.begin_transaction()
            raise Aborted(error.str()) from exc
        producer.begin_transaction()

    @staticmethod
    def _retry(call: Callable[[], object]) -> None:
        retry_transactional(call)
