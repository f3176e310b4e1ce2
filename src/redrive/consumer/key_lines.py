"""Key lines: key order through retries kept in the tier topics (``ordering="key"``
with the ``topics`` and ``retry-topic`` strategies).

A failed record of an ordered route goes to its tier as the head of its key's line;
every later record of that key read from the source goes behind it, as a copy in a
tier topic (``redrive-order: behind``, due at once), instead of reaching the handler.
A key's line is its records not done with yet, in source offset order, each with its
place: the tier topic where its one live copy is. Only the head (lowest offset) may
reach the handler; a copy of any other record is moved behind the record before it
(written again at the end of that record's tier partition). A tier partition is read
in order, so a moved copy comes back only once the record before it has been read
there: nothing spins, and each failure of a head moves each record behind it at most
once. The record before may have been moved on meanwhile: then the copy moves again.

Invariant: for each key of a partition of an ordered route, every record handed off
and not done with has exactly one entry in the line, at the place of its one live
copy; a copy is handled only while it is the line's head. Every change is written to
the compacted ``<group>.<topic>.held`` topic (key: the record key; value: the line,
``offset@delay,...`` with each place as its tier's delay in ms; a tombstone once the
line is empty) in the App's transaction, with the copies and the offsets: a
transaction that did not commit left neither (this is why the strategy requires
``transactional=True``). Lines are read back when the partition is assigned; an App
with signing keys signs each line's record and ignores, reading back, any that does
not verify where it was read (:mod:`redrive.consumer.bookkeeping`).

The source partition and its tier partitions must belong to the same App instance
(the lines of a partition live in one place): the range assignor, librdkafka's
default, gives them to the same member, since the tiers have the source's partition
count.

Cost: memory for one entry per record handed off and not done with (its offset and a
reference to its tier's name), and the line's value written to the held topic at each
change (about 12 bytes per entry).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import structlog

from redrive.consumer.bookkeeping import BookkeepingCheck
from redrive.consumer.co_partitioned import check_assignor
from redrive.consumer.held_keys import read_back
from redrive.consumer.offsets import Partition
from redrive.consumer.publisher import Publisher
from redrive.errors import ConfigError

if TYPE_CHECKING:
    from redrive.consumer.routes import Route

log = structlog.get_logger("redrive.consumer")

Entry = tuple[int, str]
"""A record of a key's line: its source offset, and the tier topic of its live copy."""


class KeyLines:
    """The lines of the held keys of the partitions this App owns (see the module)."""

    @classmethod
    def of(
        cls, publisher: Publisher, routes: Iterable[Route], check: BookkeepingCheck | None = None
    ) -> KeyLines:
        """For the routes that keep key order in their tier topics."""
        ordered = [r for r in routes if r.ordering is not None and r.lines_in_tiers]
        held = {r.topic: r.held_topic for r in ordered}
        return cls(publisher, held, {r.topic: r.tiers for r in ordered}, check)

    def __init__(
        self,
        publisher: Publisher,
        held_topics: Mapping[str, str],
        tiers: Mapping[str, Mapping[int, str]],
        check: BookkeepingCheck | None = None,
    ) -> None:
        self.publisher = publisher
        self.check = check
        """What a record read back must pass (None: believed, as without keys)."""
        self.held_topics = dict(held_topics)
        """Ordered route topic -> its held-keys topic."""
        self.tiers = {topic: dict(by_delay) for topic, by_delay in tiers.items()}
        """Ordered route topic -> its tiers (nominal delay in ms -> tier topic)."""
        self._delays = {
            topic: {name: delay for delay, name in by_delay.items()}
            for topic, by_delay in self.tiers.items()
        }
        self.by_partition: dict[Partition, dict[bytes, list[Entry]]] = {}

    def held(self, topic: str, partition: int, key: bytes) -> bool:
        """Whether ``key`` has a line (a record handed off and not done with)."""
        lines = self.by_partition.get((topic, partition))
        return lines is not None and key in lines

    def tail(self, topic: str, partition: int, key: bytes) -> str:
        """Where a new record of a held key goes: behind the last of its line."""
        return self.by_partition[(topic, partition)][key][-1][1]

    def append(self, topic: str, partition: int, key: bytes, offset: int, place: str) -> None:
        """A record read from the source went behind the line's last, at ``place``."""
        lines = self._owned(topic, partition)
        if lines is None:
            return
        line = lines.setdefault(key, [])
        if line and line[-1][0] >= offset:
            return  # read again (after a rewind): it is in the line already
        line.append((offset, place))
        self._write(topic, partition, key, line)

    def where(self, topic: str, partition: int, key: bytes, offset: int, place: str) -> str:
        """What a copy of the record at ``offset`` read from tier ``place`` is to its
        key's line: ``head`` (its turn: handle it), ``behind`` (not its turn: move it),
        ``stale`` (its live copy is elsewhere: skip it) or ``absent`` (not in a line:
        handled without order)."""
        line = self.by_partition.get((topic, partition), {}).get(key)
        for index, (entry_offset, entry_place) in enumerate(line or ()):
            if entry_offset == offset:
                if entry_place != place:
                    return "stale"
                return "head" if index == 0 else "behind"
        return "absent"

    def before(self, topic: str, partition: int, key: bytes, offset: int) -> str:
        """Where the record before the one at ``offset`` in its key's line is."""
        line = self.by_partition[(topic, partition)][key]
        index = next(i for i, (o, _) in enumerate(line) if o == offset)
        return line[index - 1][1]

    def place(self, topic: str, partition: int, key: bytes, offset: int, place: str) -> None:
        """The record at ``offset`` has its live copy at ``place`` now (moved behind, or
        its retry handed off); a record not in a line starts its key's line."""
        lines = self._owned(topic, partition)
        if lines is None:
            return
        line = lines.setdefault(key, [])
        for index, (entry_offset, _) in enumerate(line):
            if entry_offset == offset:
                line[index] = (offset, place)
                break
        else:
            line.append((offset, place))
            line.sort()
        self._write(topic, partition, key, line)

    def done(self, topic: str, partition: int, key: bytes, offset: int) -> bool:
        """The App is done with the record at ``offset`` (handled, or a dead letter): it
        leaves its line; True if the key is free."""
        lines = self.by_partition.get((topic, partition))
        line = None if lines is None else lines.get(key)
        if lines is None or line is None:
            return False
        kept = [entry for entry in line if entry[0] != offset]
        if len(kept) == len(line):
            return False
        if kept:
            lines[key] = kept
        else:
            del lines[key]
        self._write(topic, partition, key, kept)
        return not kept

    def _owned(self, topic: str, partition: int) -> dict[bytes, list[Entry]] | None:
        """The lines of a partition this App owns (read back on assignment); None, with
        a warning, for any other: a record whose redrive headers name a partition or
        topic not its own (forged, or corrupt) starts no line there."""
        lines = self.by_partition.get((topic, partition))
        if lines is None:
            log.warning(
                "key line of a partition this App does not own; not kept",
                topic=topic,
                partition=partition,
            )
        return lines

    def count(self, topic: str) -> int:
        """The records in the lines of ``topic`` (handed off, not done with)."""
        return sum(
            len(line)
            for (t, _), lines in self.by_partition.items()
            if t == topic
            for line in lines.values()
        )

    def forget(self, partitions: Iterable[Partition]) -> None:
        """Partitions leave this App: their next owner reads their lines back."""
        for partition in partitions:
            self.by_partition.pop(partition, None)

    def load(self, config: Mapping[str, Any], partitions: Iterable[Partition]) -> None:
        """Read back the lines of newly assigned partitions of ordered routes."""
        found = read_back(config, self.held_topics, partitions, self.check)
        for partition, values in found.items():
            self.restore(partition, values)

    def restore(self, partition: Partition, values: Mapping[bytes, bytes]) -> None:
        """A partition's lines from the last value of each key in its held topic."""
        topic = partition[0]
        lines: dict[bytes, list[Entry]] = {}
        for key, value in values.items():
            line = self._decode(topic, value)
            if line is None:
                log.warning(
                    "held-keys record not a key line; skipped",
                    topic=self.held_topics[topic],
                    partition=partition[1],
                )
            elif line:
                lines[key] = line
        self.by_partition[partition] = lines

    def _write(self, topic: str, partition: int, key: bytes, line: list[Entry]) -> None:
        value = None
        if line:
            delays = self._delays[topic]
            value = ",".join(f"{offset}@{delays[place]}" for offset, place in line).encode()
        self.publisher.put(self.held_topics[topic], key=key, value=value, partition=partition)

    def _decode(self, topic: str, value: bytes) -> list[Entry] | None:
        """A line as written by :meth:`_write`; None if it is not one. An entry whose
        tier the route no longer has (its policy changed) is dropped, with a warning:
        its copy is in a topic the App does not read any more, and would hold its key
        for ever."""
        tiers = self.tiers[topic]
        line: list[Entry] = []
        try:
            for entry in value.decode("ascii").split(","):
                offset, _, delay = entry.partition("@")
                place = tiers.get(int(delay))
                if place is None:
                    log.warning(
                        "key line names a tier the route no longer has; entry dropped",
                        topic=topic,
                        offset=int(offset),
                        delay_ms=int(delay),
                    )
                    continue
                line.append((int(offset), place))
        except ValueError:
            return None
        return sorted(line)


def check_key_lines(
    topic: str, strategy: str, transactional: bool, settings: Mapping[str, Any]
) -> None:
    """Key lines move a record's copy and rewrite its line in one step, and keep a
    partition's lines with the App instance that reads the partition and its tiers:
    a ConfigError unless the App is transactional and its assignor keeps a partition
    with its tiers (``settings``: the consumer's librdkafka settings)."""
    setting = f"ordering for {topic!r}"
    if not transactional:
        raise ConfigError(
            setting,
            f"the {strategy} strategy keeps key order only with transactions "
            "(a record's copy and its key's line are written in one step)",
            'use App(..., transactional=True), or strategy="service"',
        )
    check_assignor(topic, "retry tiers", settings)
