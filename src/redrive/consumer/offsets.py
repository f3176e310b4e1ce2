"""Which offsets may be committed: only those of records fully dealt with.

A record is dealt with when its handler succeeded, or its retry or dead letter was
handed to Kafka and acknowledged. The loop marks records as it goes; before each
commit it makes its producer flush, so a hand-off is acknowledged before the offset
past it is committed. A rewound record (blocking, pause) is never marked, so its
offset is not committed until it has been dealt with.
"""

from __future__ import annotations

from confluent_kafka import TopicPartition

Partition = tuple[str, int]


class OffsetTracker:
    def __init__(self) -> None:
        self._next: dict[Partition, int] = {}
        self._committed: dict[Partition, int] = {}

    def mark(self, partition: Partition, offset: int) -> None:
        """The record at `offset` is dealt with: the position moves past it."""
        self._next[partition] = offset + 1

    def to_commit(self, partitions: set[Partition] | None = None) -> list[TopicPartition]:
        """Positions not committed yet (of the given partitions, or all)."""
        return [
            TopicPartition(topic, partition, offset)
            for (topic, partition), offset in self._next.items()
            if (partitions is None or (topic, partition) in partitions)
            and self._committed.get((topic, partition)) != offset
        ]

    def committed(self, offsets: list[TopicPartition]) -> None:
        for tp in offsets:
            self._committed[(tp.topic, tp.partition)] = tp.offset

    def forget(self, partitions: set[Partition]) -> None:
        """Partitions revoked: their positions belong to the next owner now."""
        for partition in partitions:
            self._next.pop(partition, None)
            self._committed.pop(partition, None)
