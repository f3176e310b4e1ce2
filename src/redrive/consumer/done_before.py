"""Records a partition's last commit named as dealt with beyond its position
(:mod:`redrive.consumer.done_ahead`), skipped when they are read again.

A commit's position can stay below records already dealt with: async handlers end out
of order, and records kept behind a held key (:mod:`redrive.consumer.kept_lines`) hold
it back while later ones are handled. When a partition is assigned, or rewound after an
aborted transaction, its commit's metadata is read back here; each record it names is
skipped once, when read again, its hand-off having committed with the position.

Invariant: an offset is skipped only if the partition's last commit named it, and at
most once per resume. Until it is read again it stays named: every commit of this run
names it too (:meth:`DoneBefore.unread`, asked by
:class:`redrive.consumer.offsets.OffsetTracker`), since its hand-off is visible and a
commit that forgot it would have it made again after the next crash or rewind.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from confluent_kafka import TopicPartition

from redrive.consumer import done_ahead
from redrive.consumer.offsets import Partition


class DoneBefore:
    """Per partition, the offsets its last commit named as dealt with (see the module)."""

    def __init__(self) -> None:
        self.by_partition: dict[Partition, set[int]] = {}

    def resume(self, committed: Iterable[TopicPartition]) -> None:
        """Partitions (re)start from their committed positions."""
        for tp in committed:
            done = done_ahead.decode(tp.metadata, tp.offset)
            if done:
                self.by_partition[(tp.topic, tp.partition)] = set(done)
            else:
                self.by_partition.pop((tp.topic, tp.partition), None)

    def unread(self, partition: Partition) -> Collection[int]:
        """The offsets the partition's last commit named and that were not read again
        since (not skipped yet)."""
        return self.by_partition.get(partition, ())

    def skip(self, partition: Partition, offset: int) -> bool:
        """Whether the record at ``offset`` was dealt with before (then forgotten: a
        record read a second time after this is not)."""
        done = self.by_partition.get(partition)
        if done is None or offset not in done:
            return False
        done.discard(offset)
        if not done:
            del self.by_partition[partition]
        return True

    def forget(self, partitions: Iterable[Partition]) -> None:
        for partition in partitions:
            self.by_partition.pop(partition, None)
