"""Which offsets may be committed: only those of records fully dealt with.

A record is dealt with when its handler succeeded, or its retry or dead letter was
handed to Kafka and acknowledged. The loop marks records as it goes; before each
commit it makes its producer flush, so a hand-off is acknowledged before the offset
past it is committed. A rewound record (blocking, pause) is never marked, so its
offset is not committed until it has been dealt with.

Invariant: every commit covers every hand-off made before it (its record is before
the position, or named done beyond it by the metadata, :mod:`redrive.consumer.done_ahead`).
With transactions a hand-off is visible once its transaction commits, and a restarted
App reads again only what the committed position and metadata do not cover: a
hand-off a commit left uncovered would be made a second time. Two things keep it:

- a partition has a position from its start in a run (its committed offset, when it
  is assigned or rewound: :meth:`OffsetTracker.resume`; else the first record read of
  it, :meth:`OffsetTracker.reached`), not only once its first record is done: async
  records end out of order, and a commit of the records done after a first one still
  running must name them with the partition's offsets;
- the records the partition's last commit named done beyond its position, not read
  again yet in this run (:mod:`redrive.consumer.done_before`), are named again by
  each commit until they are read again (and then skipped, and named as dealt with)
  or the position passes them: their hand-offs are visible, and a commit that forgot
  them would have them made again after the next crash, rewind or rebalance.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from confluent_kafka import TopicPartition

from redrive.consumer import done_ahead

Partition = tuple[str, int]


class OffsetTracker:
    def __init__(self) -> None:
        self._next: dict[Partition, int] = {}
        self._committed: dict[Partition, tuple[int, str]] = {}
        self.done_beyond: Callable[[Partition], list[int]] | None = None
        """The records dealt with after a partition's position, if they may be (async
        handlers end out of order): named in the commit's metadata."""
        self.kept: Callable[[Partition], list[int]] | None = None
        """The records of a partition read but not dealt with yet (kept behind a held
        key), ascending: the position is held at the first, and the records after it
        but these are named in the commit's metadata."""
        self.named_before: Callable[[Partition], Collection[int]] | None = None
        """The records a partition's last commit before this run (or rewind) named done
        beyond its position and not read again since
        (:meth:`redrive.consumer.done_before.DoneBefore.unread`): named again by every
        commit (see the module)."""

    def _position(self, partition: Partition, position: int) -> tuple[int, str]:
        """The offset to commit for a partition whose records before ``position`` were
        read, and its metadata."""
        named = self.named_before(partition) if self.named_before is not None else ()
        # Not read again yet, so beyond every record read: beyond the position too.
        unread = sorted(offset for offset in named if offset >= position) if named else []
        if self.kept is not None:
            kept = self.kept(partition)
            if kept and kept[0] < position:
                return kept[0], done_ahead.encode_except(kept[0], position, kept, unread)
        if self.done_beyond is None:
            return position, done_ahead.encode(position, unread) if unread else ""
        done = self.done_beyond(partition)
        if unread:
            done = sorted({*done, *unread})
        return position, done_ahead.encode(position, done)

    def mark(self, partition: Partition, offset: int) -> None:
        """The record at `offset` is dealt with: the position moves past it."""
        self._next[partition] = offset + 1

    def resume(self, committed: Iterable[TopicPartition]) -> None:
        """Partitions (re)start from their committed offsets (assigned, or rewound after
        an aborted transaction): each one's position is its committed offset until a
        record of it is dealt with in this run. A partition without one (none
        committed, or it could not be read) gets its position from its first record
        read (:meth:`reached`)."""
        for tp in committed:
            if tp.offset >= 0 and tp.error is None:
                self._next[(tp.topic, tp.partition)] = tp.offset

    def reached(self, partition: Partition, offset: int) -> None:
        """A record of ``partition`` at ``offset`` is read, before anything is done with
        it: a partition without a position yet starts there (the records before it
        were not read in this run: dealt with before it, or never to be read), so that
        a commit of the records done after it, while it runs, carries the partition's
        offsets (see the module)."""
        if partition not in self._next:
            self._next[partition] = offset

    def to_commit(self, partitions: set[Partition] | None = None) -> list[TopicPartition]:
        """Positions (with what is done beyond them) not committed yet, of the given
        partitions or all."""
        wanted = []
        for (topic, partition), offset in self._next.items():
            if partitions is not None and (topic, partition) not in partitions:
                continue
            offset, metadata = self._position((topic, partition), offset)
            if self._committed.get((topic, partition)) != (offset, metadata):
                wanted.append(TopicPartition(topic, partition, offset, metadata=metadata))
        return wanted

    def committed(self, offsets: list[TopicPartition]) -> None:
        for tp in offsets:
            self._committed[(tp.topic, tp.partition)] = (tp.offset, tp.metadata or "")

    def forget(self, partitions: set[Partition]) -> None:
        """Partitions revoked: their positions belong to the next owner now."""
        for partition in partitions:
            self._next.pop(partition, None)
            self._committed.pop(partition, None)
