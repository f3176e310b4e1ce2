"""Records dealt with beyond a committed position, written in the commit's metadata.

With ``async def`` handlers, records of a partition end out of order: the committed
position stays below the oldest record still running while later ones are done, and
their hand-offs (retry requests, dead letters, records put behind a held key) are
made. With ``transactional=True`` those hand-offs commit in the transaction that
commits the position. Were a crash to follow, those records would be read again from
the position and handed off a second time. So each commit also says, in the offset's
metadata (Kafka keeps a string with each committed offset, in the same transaction),
which records beyond the position are dealt with; when a partition is assigned again,
or rewound after an aborted transaction, the App reads it back and skips those
records as the repeats they are.

Invariant: a record beyond a partition's committed position is skipped when read
again if and only if the commit that wrote the position named it: its hand-off is
then visible (it committed in the same transaction), and it is never made twice.

The metadata is ``rd1:`` and the base64 (URL-safe) of varints: the lengths of the
alternating runs of offsets after the position, not done, done, not done, ... Its
size grows with the gaps (records still running), not with how many are done: at
most two runs per record in flight, so it stays under Kafka's default limit of
4,096 characters (``offset.metadata.max.bytes``) up to several hundred records in
flight. Beyond :data:`MAX_CHARS` the runs furthest from the position are left out:
those records are then handled again after a crash (at least once), and their
hand-offs' receivers drop the repeats.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator
from typing import Final

PREFIX: Final = "rd1:"
MAX_CHARS: Final = 4000
"""Longest metadata written: under the broker's default ``offset.metadata.max.bytes``."""


_LIMIT: Final = (MAX_CHARS - len(PREFIX)) * 3 // 4 - 20
"""The most bytes of runs written: base64 makes 4 characters of 3 bytes."""


def _varint(value: int, out: bytearray) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _written(position: int, done: Iterable[tuple[int, int]]) -> str:
    """The metadata naming the records of the runs ``done`` (``[start, stop)``, ascending,
    disjoint, from ``position`` on) as dealt with; the runs furthest from the position
    are left out beyond :data:`MAX_CHARS`."""
    runs = bytearray()
    cursor = position
    for start, stop in done:
        if stop <= start or start < cursor:
            continue  # empty, or not beyond what is written already: ignored
        if len(runs) > _LIMIT:
            break
        _varint(start - cursor, runs)  # not done
        _varint(stop - start, runs)  # done
        cursor = stop
    if not runs:
        return ""
    return PREFIX + base64.urlsafe_b64encode(bytes(runs)).decode("ascii")


def _runs_of(offsets: Iterable[int], after: int) -> Iterator[tuple[int, int]]:
    """Ascending ``offsets`` (those not beyond ``after`` ignored) as runs of consecutive
    offsets, ``[start, stop)``."""
    start = stop = None
    previous = after
    for offset in offsets:
        if offset <= previous:
            continue  # not beyond the position, or out of order: ignored
        if start is None or offset != stop:
            if start is not None and stop is not None:
                yield start, stop
            start = offset
        stop = offset + 1
        previous = offset
    if start is not None and stop is not None:
        yield start, stop


def encode(position: int, done: Iterable[int]) -> str:
    """The metadata for a commit at ``position`` (the next offset to read) when the
    records at ``done`` (offsets after it, ascending) are dealt with; "" if none."""
    return _written(position, _runs_of(done, position - 1))


def encode_except(position: int, end: int, not_done: list[int], beyond: Iterable[int] = ()) -> str:
    """The metadata for a commit at ``position`` when every record from it up to
    ``end`` (excluded) is dealt with but those at ``not_done`` (ascending, from
    ``position``), and after ``end`` those at ``beyond`` (ascending); as :func:`encode`
    of those records, without listing each."""

    def runs() -> Iterator[tuple[int, int]]:
        cursor, index, count = position, 0, len(not_done)
        while index < count and not_done[index] < cursor:
            index += 1  # before the position: not beyond it
        while cursor < end:
            while index < count and not_done[index] == cursor:
                cursor += 1
                index += 1
            stop = min(not_done[index] if index < count else end, end)
            if stop <= cursor:
                break
            yield cursor, stop
            cursor = stop
        yield from _runs_of(beyond, end - 1)

    return _written(position, runs())


def decode(metadata: str | None, position: int) -> frozenset[int]:
    """The offsets a commit at ``position`` named as dealt with; none for metadata this
    module did not write (another tool's, or damaged)."""
    if not metadata or not metadata.startswith(PREFIX) or position < 0:
        return frozenset()
    try:
        data = base64.urlsafe_b64decode(metadata[len(PREFIX) :])
    except ValueError:
        return frozenset()
    values: list[int] = []
    value = shift = 0
    for byte in data:
        value |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            continue
        values.append(value)
        value = shift = 0
    if shift or len(values) % 2:
        return frozenset()  # cut short: trust none of it
    done: set[int] = set()
    offset = position
    for skipped, run in zip(values[::2], values[1::2], strict=True):
        offset += skipped
        done.update(range(offset, offset + run))
        offset += run
    return frozenset(done)
