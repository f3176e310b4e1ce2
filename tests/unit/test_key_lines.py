"""Key lines in the tier topics (``ordering="key"`` with ``topics``), without a broker.

The last test plays the App's rules for a key line (records.py, ``_in_line`` and the
hand-offs) over tier partitions modelled as FIFO lists whose first record holds the
partition until it is due, with the reading order, the handler's outcomes and
restarts (the lines read back from what was written) drawn by hypothesis: every
record of every key reaches the handler or becomes a dead letter exactly once, in
offset order, and nothing is left waiting."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redrive.consumer.key_lines import KeyLines
from redrive.consumer.publisher import Publisher

pytestmark = pytest.mark.unit

TIERS = {1000: "g.items.retry.1s", 5000: "g.items.retry.5s"}
T1, T5 = TIERS[1000], TIERS[5000]


class Written:
    """What KeyLines writes, by (topic, partition, key): the last value (None: tombstone)."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, int, bytes], bytes | None] = {}

    def put(self, topic: str, *, key: bytes, value: bytes | None, partition: int) -> None:
        self.last[(topic, partition, key)] = value

    def values(self, partition: int) -> dict[bytes, bytes]:
        return {k: v for (_, p, k), v in self.last.items() if p == partition and v is not None}


def key_lines(written: Written, *partitions: int) -> KeyLines:
    """KeyLines owning ``partitions`` of topic items (as if assigned, with empty lines)."""
    lines = KeyLines(cast(Publisher, written), {"items": "g.items.held"}, {"items": TIERS})
    for partition in partitions:
        lines.restore(("items", partition), {})
    return lines


def test_a_line_keeps_its_records_in_offset_order_with_their_places() -> None:
    written = Written()
    lines = key_lines(written, 0)
    assert not lines.held("items", 0, b"k")
    lines.place("items", 0, b"k", 10, T1)  # a failed record: the head, in tier 1s
    lines.append("items", 0, b"k", 12, lines.tail("items", 0, b"k"))  # behind it
    lines.append("items", 0, b"k", 12, T5)  # read again after a rewind: ignored
    assert written.last[("g.items.held", 0, b"k")] == b"10@1000,12@1000"
    assert lines.where("items", 0, b"k", 10, T1) == "head"
    assert lines.where("items", 0, b"k", 12, T1) == "behind"
    assert lines.where("items", 0, b"k", 12, T5) == "stale"  # its live copy is in 1s
    assert lines.where("items", 0, b"k", 11, T1) == "absent"
    assert lines.where("items", 1, b"k", 10, T1) == "absent"  # another partition
    lines.place("items", 1, b"k", 10, T1)  # not owned (forged coordinates): no line
    assert not lines.held("items", 1, b"k")
    assert ("g.items.held", 1, b"k") not in written.last
    lines.place("items", 0, b"k", 10, T5)  # the head failed again: to 5s
    assert lines.before("items", 0, b"k", 12) == T5
    assert not lines.done("items", 0, b"k", 10)
    assert lines.where("items", 0, b"k", 12, T1) == "head"
    assert lines.count("items") == 1
    assert lines.done("items", 0, b"k", 12)
    assert not lines.held("items", 0, b"k")
    assert written.last[("g.items.held", 0, b"k")] is None  # a tombstone


def test_lines_are_read_back_as_written_and_unreadable_ones_skipped() -> None:
    written = Written()
    lines = key_lines(written, 3)
    lines.place("items", 3, b"a", 7, T5)
    lines.append("items", 3, b"a", 9, T5)
    restarted = key_lines(Written())
    restarted.restore(
        ("items", 3),
        {
            **written.values(3),
            b"bad": b"not a line",
            b"gone": b"4@60000,6@1000",  # a tier the route no longer has: entry dropped
        },
    )
    assert restarted.by_partition[("items", 3)] == {b"a": [(7, T5), (9, T5)], b"gone": [(6, T1)]}


@dataclass(frozen=True)
class Copy:
    key: bytes
    offset: int
    attempt: int
    due: int


POLICY_DELAYS = {1: 1000, 2: 5000}  # after failed attempt n, the retry waits this long
ATTEMPTS = 3  # a record failing 3 times is a dead letter


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(st.sampled_from([b"a", b"b", b"c"]), min_size=1, max_size=25),
    choices=st.lists(st.integers(0, 2), max_size=400),
    outcomes=st.lists(st.booleans(), max_size=400),
    restarts=st.sets(st.integers(0, 400), max_size=5),
)
def test_the_apps_rules_keep_each_keys_records_in_order_and_lose_none(
    keys: list[bytes], choices: list[int], outcomes: list[bool], restarts: set[int]
) -> None:
    written = Written()
    lines = key_lines(written, 0)
    source = [Copy(key, offset, 0, 0) for offset, key in enumerate(keys)]
    tiers: dict[str, list[Copy]] = {T1: [], T5: []}
    seen: dict[bytes, list[int]] = defaultdict(list)  # handled for good or dead, in order
    now = 0
    step = 0
    draws, fails = iter(choices), iter(outcomes)

    def handle(record: Copy, from_tier: bool) -> None:
        if not next(fails, False):  # success
            seen[record.key].append(record.offset)
            if from_tier:
                lines.done("items", 0, record.key, record.offset)
            return
        attempt = record.attempt + 1
        if attempt >= ATTEMPTS:  # a dead letter: leaves its line too
            seen[record.key].append(record.offset)
            if from_tier:
                lines.done("items", 0, record.key, record.offset)
            return
        delay = POLICY_DELAYS[attempt]
        tier = TIERS[delay]
        tiers[tier].append(Copy(record.key, record.offset, attempt, now + delay))
        lines.place("items", 0, record.key, record.offset, tier)

    while source or any(tiers.values()):
        step += 1
        assert step < 5000, "no progress: a record waits for ever"
        if step in restarts:  # what a restart (or an aborted transaction) reads back
            lines = key_lines(written)
            lines.restore(("items", 0), written.values(0))
        readable = [name for name, queue in tiers.items() if queue and queue[0].due <= now]
        if source:
            readable.append("source")
        if not readable:  # every tier's first record waits: time passes
            now = min(queue[0].due for queue in tiers.values() if queue)
            continue
        now += 10
        chosen = readable[next(draws, 0) % len(readable)]
        if chosen == "source":
            record = source.pop(0)
            if lines.held("items", 0, record.key):
                place = lines.tail("items", 0, record.key)
                tiers[place].append(Copy(record.key, record.offset, 0, now))
                lines.append("items", 0, record.key, record.offset, place)
            else:
                handle(record, from_tier=False)
            continue
        copy = tiers[chosen].pop(0)
        turn = lines.where("items", 0, copy.key, copy.offset, chosen)
        assert turn in ("head", "behind"), turn  # nothing stale or lost without crashes
        if turn == "head":
            handle(copy, from_tier=True)
        else:
            place = lines.before("items", 0, copy.key, copy.offset)
            tiers[place].append(Copy(copy.key, copy.offset, copy.attempt, now))
            lines.place("items", 0, copy.key, copy.offset, place)

    for key in set(keys):
        assert seen[key] == [o for o, k in enumerate(keys) if k == key]
    assert lines.count("items") == 0
    assert written.values(0) == {}
