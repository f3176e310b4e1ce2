"""Which offsets may be committed: only those of records fully dealt with.

A record is dealt with when its handler succeeded, or its retry or dead letter was
handed to Kafka and acknowledged. The loop marks records as it goes; before each
commit it makes its producer flush, so a hand-off is acknowledged before the offset
past it is committed. A rewound record (blocking, pause) is never marked, so its
offset is not committed until it has been dealt with.
"""

from __future__ import annotations

from collections.abc import Callable

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

    def _position(self, partition: Partition, position: int) -> tuple[int, str]:
        """The offset to commit for a partition whose records before ``position`` were
        read, and its metadata."""
        if self.kept is not None:
            kept = self.kept(partition)
            if kept and kept[0] < position:
                return kept[0], done_ahead.encode_except(kept[0], position, kept)
        if self.done_beyond is None:
            return position, ""
        return position, done_ahead.encode(position, self.done_beyond(partition))

    def mark(self, partition: Partition, offset: int) -> None:
        """The record at `offset` is dealt with: the position moves past it."""
        self._next[partition] = offset + 1

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
