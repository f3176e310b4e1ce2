"""Kept lines: the records behind a held key kept in the App's memory while the key's
head waits for a short retry (``ordering="key"``, in the retry service or a tier).

A record read behind a held key costs, sent to the service, a request, a row, a
delivery and a release; copied behind it in a tier, a copy, and one more each time a
record before it fails again. While the head's retry is short, the records behind it
are kept here instead, in their key's line, and handled in offset order as soon as the
head is done (:meth:`redrive.consumer.pipeline.Pipeline.drain`); a failure among
them makes that record the key's new head, the rest staying behind it.

Durable without a write per record: a partition's committed position stays at its
first kept record, and the records after it that were dealt with are named in the
commit's metadata (:mod:`redrive.consumer.done_ahead`), so a crash or rebalance reads
the kept records again and skips the others; read again behind a key that is still
held, they go behind it in the service or its tier, as any record of a held key then
does (the held-keys topic says which keys wait; it does not say what it kept).

Invariant: a kept record is either in its key's line here (its partition's position
held at or before it) or taken out to be handled at once, in offset order, before any
later record of its key; a key has a line only while it is held. Bounded: at most
:attr:`KeptLines.most` records per partition (the metadata must fit Kafka's default
limit of 4,096 characters). A partition at its bound waits until heads coming back
leave it room, where they come back on another topic (a tier, a per-group retry
topic); where they come back at the end of the same partition, which may not wait for
them, the key's line goes to the service instead. No line is kept longer than
:attr:`KeptLines.longest_s` (a head that does not come back): past it, it goes where
its head waits (:meth:`take`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Container, Iterable
from typing import Final

import structlog

from redrive.clock import now_ms
from redrive.consumer.message import Message
from redrive.consumer.offsets import Partition

log = structlog.get_logger("redrive.consumer")

MOST_PER_PARTITION: Final = 500
"""Kept records per partition: each costs at most two varints in the commit's
metadata, so they fit under Kafka's default ``offset.metadata.max.bytes``."""
LONGEST_S: Final = 30.0
"""How long a line may hold its partition's position back before it goes to the
service (a head that does not come back, say the service is down)."""
FULL_WAIT_MS: Final = 1_000
"""How long at most a partition whose bound is reached waits before its record is read
again; it goes on as soon as lines leave it room (:attr:`KeptLines.roomy`)."""
ROOMY: Final = 0.75
"""A partition at its bound goes on once its kept records are down to this share of
it: not one record at a time."""
SHORT_RETRY_MS: Final = 5_000
"""A head whose retry is due within this keeps its line in memory; a longer one sends
the records behind it to the service."""

Line = deque[Message]


class KeptLines:
    """The kept lines of the partitions this App owns (see the module)."""

    def __init__(self, most: int = MOST_PER_PARTITION, longest_s: float = LONGEST_S) -> None:
        self.most = most
        self.longest_s = longest_s
        self.by_partition: dict[Partition, dict[bytes, tuple[float, Line]]] = {}
        """Per partition: key -> (when its line started, the line)."""
        self._counts: dict[Partition, int] = {}
        self.full: set[Partition] = set()
        """Partitions that found their bound reached, until they have room again."""
        self.roomy: set[Partition] = set()
        """Partitions that were full and have room again: their wait is over."""
        self.ready: deque[tuple[str, Line]] = deque()
        """Lines whose head is done, by topic: to be handled now, in order
        (:meth:`redrive.consumer.pipeline.Pipeline.drain`)."""

    def keeping(self, partition: Partition, key: bytes) -> bool:
        """Whether ``key``'s records go to its line here."""
        lines = self.by_partition.get(partition)
        return lines is not None and key in lines

    def start(self, partition: Partition, key: bytes) -> None:
        """``key`` was handed off as its line's head: records read behind it are kept
        (a line already there stays, its records behind the new head)."""
        lines = self.by_partition.setdefault(partition, {})
        if key not in lines:
            lines[key] = (time.monotonic(), deque())

    def handed_off(self, partition: Partition, key: bytes, head: bool, due_ms: int) -> bool:
        """A record of ``key`` was handed off for a retry due at ``due_ms``; ``head``: its
        key held by nothing before. True when the key's line must go where the record
        waits now (its retry is long)."""
        if due_ms - now_ms() <= SHORT_RETRY_MS:
            if head:
                self.start(partition, key)
            return False
        return self.keeping(partition, key)

    def keep(self, message: Message) -> bool:
        """Keep a record read behind its key's head; False when its partition's bound is
        reached (a line being handled goes back by :meth:`put_back` instead)."""
        partition = (message.topic, message.partition)
        count = self._counts.get(partition, 0)
        if count >= self.most:
            self.full.add(partition)
            return False
        _, line = self.by_partition[partition][message.key]  # type: ignore[index]
        if line and line[-1].offset >= message.offset:
            return True  # read again after a rewind: it is in the line already
        line.append(message)
        self._counts[partition] = count + 1
        return True

    def put_back(self, partition: Partition, key: bytes, rest: Line) -> None:
        """The rest of a line being handled goes back, whole and in order, behind its
        key's new head (one of its records that failed): whatever the bound, as each
        held a place already."""
        _, line = self.by_partition[partition][key]
        line.extend(rest)
        self._counts[partition] = self._counts.get(partition, 0) + len(rest)
        rest.clear()

    def take(self, partition: Partition, key: bytes) -> Line:
        """The key's line, out of here: to be handled now or sent to the service."""
        lines = self.by_partition.get(partition)
        if lines is None or key not in lines:
            return deque()
        _, line = lines.pop(key)
        count = self._counts[partition] = self._counts.get(partition, 0) - len(line)
        if self.full and partition in self.full and count <= self.most * ROOMY:
            self.full.discard(partition)
            self.roomy.add(partition)
        return line

    def ready_after(self, partition: Partition, key: bytes) -> None:
        """The head of ``key``'s line is done and the key free: its kept records, if any,
        are to be handled now."""
        line = self.take(partition, key)
        if line:
            self.ready.append((partition[0], line))

    def offsets(self, partition: Partition) -> list[int]:
        """The offsets of a partition's kept records, ascending."""
        lines = self.by_partition.get(partition)
        if not lines or not self._counts.get(partition):
            return []
        return sorted(message.offset for _, line in lines.values() for message in line)

    def overdue(self, topics: Container[str]) -> list[tuple[Partition, bytes]]:
        """The lines of these topics kept longer than :attr:`longest_s` (logged)."""
        oldest = time.monotonic() - self.longest_s
        found = [
            (partition, key)
            for partition, lines in self.by_partition.items()
            if partition[0] in topics
            for key, (started, line) in lines.items()
            if line and started < oldest
        ]
        for (topic, partition), _ in found:
            log.warning(
                "key's head not back in time; the records behind it go where it waits",
                topic=topic,
                partition=partition,
            )
        return found

    def count(self) -> int:
        return sum(self._counts.values())

    def forget(self, partitions: Iterable[Partition]) -> None:
        """Partitions leave this App (or are rewound): their kept records are read again
        from the committed position."""
        for partition in partitions:
            self.by_partition.pop(partition, None)
            self._counts.pop(partition, None)
            self.full.discard(partition)
            self.roomy.discard(partition)
