"""The partitions an App holds: what it commits for them, and what happens when they
come, go or are lost.

Invariant: an offset is committed only past records dealt with (handled, or handed
off and acknowledged: the publisher is flushed first); with transactions, the
hand-offs since the last commit and every partition's offsets commit as one, and an
aborted one rewinds every partition to its committed offset. A partition that leaves
(revoked: what runs for it ends and its offsets are committed first; lost: nothing
may be committed for it) is forgotten everywhere its state lives, except the wait of
a record retried in place, kept in case a rebalance gives the partition back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from redrive.consumer.async_records import AsyncRecords
from redrive.consumer.batches import Batches
from redrive.consumer.key_order import KeyOrder
from redrive.consumer.offsets import OffsetTracker, Partition
from redrive.consumer.pauses import PauseBook
from redrive.consumer.pipeline import Pipeline
from redrive.consumer.publisher import Publisher
from redrive.consumer.transactions import Aborted, Transactions
from redrive.rejoin import RejoinWatch

log = structlog.get_logger("redrive.consumer")

Rebalanced = Callable[[Consumer, list[TopicPartition]], None]
Callbacks = tuple[Rebalanced, Rebalanced, Rebalanced]
"""on_assign, on_revoke, on_lost."""


def reset_offset(consumer_settings: dict[str, Any]) -> int:
    """Where a partition without a committed offset starts, as ``auto.offset.reset``
    says (librdkafka's default: the earliest)."""
    reset = str(consumer_settings.get("auto.offset.reset", "earliest"))
    return OFFSET_END if reset in ("latest", "largest", "end") else OFFSET_BEGINNING


@dataclass
class Assignment:
    """One App run's partitions and everything that keeps state per partition."""

    consumer: Consumer
    publisher: Publisher
    offsets: OffsetTracker
    pauses: PauseBook
    records: Pipeline
    key_orders: list[KeyOrder]
    """The ways the App's ordered routes keep key order: state per partition."""
    rejoin: RejoinWatch
    client_config: dict[str, Any]
    topics: list[str]
    group: str
    start_without_commit: int
    """Where a partition without a committed offset starts (:func:`reset_offset`)."""
    transactions: Transactions | None = None
    batches: Batches | None = None
    async_records: AsyncRecords | None = None
    assigned: frozenset[Partition] = frozenset()
    _callbacks: Callbacks | None = None

    # ------------------------------------------------------------------ subscription

    def subscribe(self, callbacks: Callbacks | None = None) -> None:
        """Subscribe, with :meth:`on_assign`, :meth:`on_revoke` and :meth:`on_lost` as
        the rebalance callbacks, or ``callbacks`` that call them."""
        if callbacks is not None:
            self._callbacks = callbacks
        on_assign, on_revoke, on_lost = self._callbacks or (
            self.on_assign,
            self.on_revoke,
            self.on_lost,
        )
        self.consumer.subscribe(
            self.topics, on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost
        )

    def subscribe_again(self) -> None:
        """No assignment since the partitions were lost (see redrive.rejoin)."""
        log.warning(
            "no partitions assigned since they were lost; subscribing again",
            group=self.group,
            waited_s=self.rejoin.after_s,
        )
        self.consumer.unsubscribe()
        self.subscribe()

    # ------------------------------------------------------------------ commits

    def commit(self, *, asynchronous: bool, partitions: set[Partition] | None = None) -> None:
        self.publisher.flush()  # hand-offs acknowledged before the offsets move past them
        if self.transactions is not None:
            self._commit_transaction()
            return
        offsets = self.offsets.to_commit(partitions)
        if not offsets:
            return
        try:
            if asynchronous:
                self.consumer.commit(offsets=offsets, asynchronous=True)
            else:
                self.offsets.committed(self.consumer.commit(offsets=offsets, asynchronous=False))
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:
                log.warning("commit failed; records may be handled again", error=str(exc))

    def _commit_transaction(self) -> None:
        """Commit the hand-offs since the last commit with every partition's offsets (not
        only those of some partitions: the transaction holds the hand-offs of all)."""
        assert self.transactions is not None
        offsets = self.offsets.to_commit()
        try:
            self.transactions.commit(offsets)
        except Aborted:
            self.publisher.committed()  # none is left to be visible: they are gone
            self.records.outcomes.repeats.abort()  # those hand-offs are gone: not repeats
            self._rewind()
            return
        self.publisher.committed()
        self.records.outcomes.repeats.commit()
        self.offsets.committed(offsets)

    def _rewind(self) -> None:
        """A transaction was aborted: what was dealt with since the last commit is
        handled again, from every partition's committed offset (the waits of records
        retried in place are kept, as across a rebalance)."""
        assigned = set(self.assigned)
        self._forget(assigned)
        self.assigned = frozenset(assigned)
        for order in self.key_orders:  # as the transaction left them
            order.load(self.client_config, assigned)
        wanted = [TopicPartition(t, p) for t, p in sorted(assigned)]
        committed = self.consumer.committed(wanted, timeout=30) if wanted else []
        self.records.done_before.resume(committed)
        self.offsets.resume(committed)
        for tp in committed:
            offset = tp.offset if tp.offset >= 0 else self.start_without_commit
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
        log.warning("rewound to the committed offsets", partitions=len(wanted))

    # ------------------------------------------------------------------ rebalances

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.rejoin.assigned()
        # Added to, not replaced: with cooperative rebalancing these are the new ones.
        new = {(p.topic, p.partition) for p in partitions}
        self.assigned = self.assigned | new
        # Before any record of theirs: which keys of ordered routes wait for a retry.
        for order in self.key_orders:
            order.load(self.client_config, new)
        # What the last commit says is dealt with beyond its position; and the position
        # itself, which each commit carries from now on, also before a record of the
        # partition is done here (see redrive.consumer.offsets).
        committed = consumer.committed(partitions, timeout=30)
        self.records.done_before.resume(committed)
        self.offsets.resume(committed)
        log.info(
            "partitions assigned",
            partitions=[f"{p.topic}[{p.partition}]" for p in partitions],
            committed=[f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in committed],
        )

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        lost = {(p.topic, p.partition) for p in partitions}
        try:
            if self.async_records is not None:  # what runs for them ends before the commit
                self.async_records.drain(lost)
            self.commit(asynchronous=False, partitions=lost)
        finally:
            self._forget(lost)
        log.info("partitions revoked", partitions=sorted(f"{t}[{p}]" for t, p in lost))

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.rejoin.lost(time.monotonic())
        lost = {(p.topic, p.partition) for p in partitions}
        self._forget(lost)
        log.warning("partitions lost", partitions=sorted(f"{t}[{p}]" for t, p in lost))

    def _forget(self, partitions: set[Partition]) -> None:
        """Partitions leave this instance. Positions go (the next owner commits its own);
        a partition waiting for a retry is resumed in the client but its wait and attempt
        count are kept, in case a rebalance gives it back: then its record waits until
        due again, with its attempts counted, instead of staying paused forever."""
        self.assigned = self.assigned - partitions
        self.offsets.forget(partitions)
        self.records.done_before.forget(partitions)
        for order in self.key_orders:
            order.forget(partitions)
        self.pauses.release(partitions)
        parked = self.pauses.parked()
        for partition in partitions:
            if partition not in parked:
                self.records.in_place.pop(partition, None)
        if self.batches is not None:
            self.batches.forget(partitions)
        if self.async_records is not None:
            self.async_records.forget(partitions)
