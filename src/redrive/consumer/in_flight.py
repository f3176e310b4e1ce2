"""Records of async handlers in flight: which offset a partition's position may reach.

Async handlers end out of order (one key's record ends before an earlier record of
another key in the same partition), but a committed offset means "everything before
it is dealt with".

Invariant: the position this book gives for a partition never passes a record it
accepted and that is not done yet. A record is accepted when the loop hands it to its
lane, done when it is dealt with (handled, its retry handed off, dead-lettered); a
record given up on (dropped: it will be fetched again after a seek, or never, the App
stopping) keeps the position below it for good.

Each partition's accepted offsets are kept in a dict in the order they were accepted,
which is offset order (a partition's records reach the loop in offset order): the
position moves when the oldest accepted records are done, by popping them from the
front, so each record costs O(1) however many are in flight.
"""

from __future__ import annotations

from collections.abc import Callable

from redrive.consumer.offsets import Partition


class InFlight:
    def __init__(self) -> None:
        self._open: dict[Partition, dict[int, bool | None]] = {}
        """Per partition: accepted offsets, in order, each True once done, False while
        open, None when given up (see :meth:`give_up`)."""
        self.count = 0
        """Records accepted and neither done nor dropped (the App's ``max_in_flight``)."""

    def accept(self, partition: Partition, offset: int) -> None:
        self._open.setdefault(partition, {})[offset] = False
        self.count += 1

    def done(self, partition: Partition, offset: int) -> int | None:
        """The record is dealt with; the offset whose position may now be marked (every
        accepted record up to it is done), or None when the position does not move.
        A record this book no longer knows (its partition revoked since) is ignored."""
        book = self._open.get(partition)
        if book is None or book.get(offset) is not False:
            return None
        book[offset] = True
        self.count -= 1
        moved = None
        for first, finished in book.items():
            if finished is not True:
                break
            moved = first
        if moved is None:
            return None
        while True:  # pop the done prefix: the oldest first, up to `moved`
            first = next(iter(book))
            del book[first]
            if first == moved:
                break
        if not book:
            del self._open[partition]
        return moved

    def drop_from(self, partition: Partition, offset: int) -> None:
        """Records from ``offset`` on will be fetched again (their partition was sought
        back): forgotten, not done, so the position stays below ``offset``. Only for
        records not started yet, or the one whose failure sought its partition back."""
        book = self._open.get(partition)
        if book is None:
            return
        while book:
            last = next(reversed(book))
            if last < offset:
                break
            if book.pop(last) is False:
                self.count -= 1
        if not book:
            del self._open[partition]

    def give_up(self, partition: Partition, offset: int) -> None:
        """A record that will not be dealt with by this instance (the App stops before it
        started): it no longer counts as in flight, and the position stays below it."""
        book = self._open.get(partition)
        if book is not None and book.get(offset) is False:
            self.count -= 1
            book[offset] = None

    def holds(self, partition: Partition, offset: int) -> bool:
        """Whether the record is accepted and open here (not done, given up or forgotten)."""
        book = self._open.get(partition)
        return book is not None and book.get(offset) is False

    def done_beyond(self, partition: Partition) -> list[int]:
        """The offsets done after the partition's first record not done, ascending (the
        records a commit at that position names: :mod:`redrive.consumer.done_ahead`)."""
        book = self._open.get(partition)
        if book is None:
            return []
        return [offset for offset, finished in book.items() if finished is True]

    def open_in(self, chosen: Callable[[Partition], bool]) -> list[Partition]:
        """The ``chosen`` partitions with a record accepted and not yet done."""
        return [
            partition
            for partition, book in self._open.items()
            if chosen(partition) and any(finished is False for finished in book.values())
        ]

    def forget(self, partitions: set[Partition]) -> None:
        """Partitions revoked: their records are no longer this book's."""
        for partition in partitions:
            book = self._open.pop(partition, None)
            if book is not None:
                self.count -= sum(1 for finished in book.values() if finished is False)
