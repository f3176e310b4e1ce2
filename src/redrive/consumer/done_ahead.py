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
from collections.abc import Iterable
from typing import Final

PREFIX: Final = "rd1:"
MAX_CHARS: Final = 4000
"""Longest metadata written: under the broker's default ``offset.metadata.max.bytes``."""


def _varint(value: int, out: bytearray) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def encode(position: int, done: Iterable[int]) -> str:
    """The metadata for a commit at ``position`` (the next offset to read) when the
    records at ``done`` (offsets after it, ascending) are dealt with; "" if none."""
    runs = bytearray()
    expected = position
    run_start: int | None = None
    previous = position - 1
    limit = (MAX_CHARS - len(PREFIX)) * 3 // 4 - 20  # base64: 4 characters per 3 bytes
    for offset in done:
        if offset <= previous:
            continue  # not beyond the position, or out of order: ignored
        if run_start is None or offset != previous + 1:
            if run_start is not None:
                _varint(previous + 1 - run_start, runs)  # the done run that ended
            if len(runs) > limit:
                run_start = None
                break
            _varint(offset - expected if run_start is None else offset - previous - 1, runs)
            run_start = offset
        previous = offset
        expected = offset + 1
    if run_start is not None:
        _varint(previous + 1 - run_start, runs)
    if not runs:
        return ""
    return PREFIX + base64.urlsafe_b64encode(bytes(runs)).decode("ascii")


def encode_except(position: int, end: int, not_done: list[int]) -> str:
    """The metadata for a commit at ``position`` when every record from it up to
    ``end`` (excluded) is dealt with but those at ``not_done`` (ascending, from
    ``position``); as :func:`encode` of those records, without listing each."""
    runs = bytearray()
    limit = (MAX_CHARS - len(PREFIX)) * 3 // 4 - 20
    cursor, index, count = position, 0, len(not_done)
    while index < count and not_done[index] < cursor:
        index += 1  # before the position: not beyond it
    while cursor < end and len(runs) <= limit:
        first = cursor
        while index < count and not_done[index] == cursor:
            cursor += 1
            index += 1
        stop = min(not_done[index] if index < count else end, end)
        if stop <= cursor:
            break
        _varint(cursor - first, runs)
        _varint(stop - cursor, runs)
        cursor = stop
    if not runs:
        return ""
    return PREFIX + base64.urlsafe_b64encode(bytes(runs)).decode("ascii")


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
