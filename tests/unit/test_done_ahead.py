"""The records dealt with beyond a committed position, as the commit's metadata writes
them: read back exactly, within Kafka's default size limit, and a string this module
did not write names nothing."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from redrive.consumer.done_ahead import MAX_CHARS, PREFIX, decode, encode, encode_except
from redrive.consumer.kept_lines import MOST_PER_PARTITION
from redrive.consumer.offsets import OffsetTracker

pytestmark = pytest.mark.unit

positions = st.integers(0, 2**62)
gaps = st.lists(st.integers(1, 3_000_000), max_size=400)


def offsets_after(position: int, steps: list[int]) -> list[int]:
    done, offset = [], position
    for step in steps:
        offset += step
        done.append(offset)
    return done


@settings(max_examples=300, deadline=None)
@given(positions, gaps)
def test_what_is_written_is_read_back_or_a_prefix_of_it(position: int, steps: list[int]) -> None:
    done = offsets_after(position, steps)
    metadata = encode(position, done)
    assert len(metadata) <= MAX_CHARS
    read = sorted(decode(metadata, position))
    # Exactly, or (when it would not fit) the offsets nearest the position: never one
    # that was not done, and never a later one without the earlier ones.
    assert read == done[: len(read)]
    if len(steps) <= 300:  # a few hundred records in flight always fit
        assert read == done


def test_runs_of_done_records_cost_nothing_per_record() -> None:
    # A record stuck at the position while 100,000 after it are done: one run.
    metadata = encode(1000, range(1001, 101_001))
    assert metadata.startswith(PREFIX) and len(metadata) < 20
    assert decode(metadata, 1000) == frozenset(range(1001, 101_001))


@pytest.mark.parametrize(
    "metadata", [None, "", "checkpoint-42", f"{PREFIX}!!", f"{PREFIX}gA==", f"{PREFIX}AQ=="]
)
def test_metadata_this_module_did_not_write_names_nothing(metadata: str | None) -> None:
    # Another tool's string, a damaged one, one cut short, an odd count of runs.
    assert decode(metadata, 10) == frozenset()


def test_a_commit_carries_what_is_done_beyond_its_position_and_again_when_that_changes() -> None:
    done: dict[tuple[str, int], list[int]] = {("t", 0): [7, 8]}
    tracker = OffsetTracker()
    tracker.done_beyond = lambda partition: done.get(partition, [])
    tracker.mark(("t", 0), 4)  # the position is 5; 7 and 8 done, 5 and 6 running
    [first] = tracker.to_commit()
    assert (first.offset, decode(first.metadata, 5)) == (5, {7, 8})
    tracker.committed([first])
    assert tracker.to_commit() == []
    done[("t", 0)] = [7, 8, 9]  # the position has not moved, but more is done
    [second] = tracker.to_commit()
    assert decode(second.metadata, 5) == {7, 8, 9}


def test_without_async_handlers_a_commit_carries_no_metadata() -> None:
    tracker = OffsetTracker()
    tracker.mark(("t", 0), 4)
    assert tracker.to_commit() == [TopicPartition("t", 0, 5)]
    assert tracker.to_commit()[0].metadata == ""


kept_gaps = st.lists(st.integers(1, 40_000), max_size=600)


@settings(max_examples=300, deadline=None)
@given(positions, kept_gaps, st.integers(1, 100_000))
def test_all_but_the_kept_records_are_named_done_or_a_prefix_of_them(
    position: int, steps: list[int], beyond: int
) -> None:
    # Records kept behind held keys, the first at the position: every other record
    # read up to `end` is done.
    kept = [position, *offsets_after(position, steps)]
    end = kept[-1] + beyond
    metadata = encode_except(position, end, kept)
    assert len(metadata) <= MAX_CHARS
    read = decode(metadata, position)
    assert not read & set(kept), "a kept record named as done"
    done = [offset for offset in range(position, end) if offset not in set(kept)]
    if len(kept) <= MOST_PER_PARTITION:  # the kept lines' bound always fits
        assert sorted(read) == done
    else:  # the records nearest the position, never a later one without the earlier
        assert sorted(read) == done[: len(read)]


def test_the_position_is_held_at_the_first_kept_record() -> None:
    tracker = OffsetTracker()
    kept: dict[tuple[str, int], list[int]] = {("t", 0): [4, 6]}
    tracker.kept = lambda partition: kept.get(partition, [])
    tracker.mark(("t", 0), 9)
    tracker.mark(("t", 1), 3)
    (first, second) = sorted(tracker.to_commit(), key=lambda tp: tp.partition)
    assert (first.offset, sorted(decode(first.metadata, 4))) == (4, [5, 7, 8, 9])
    assert (second.offset, second.metadata) == (4, "")
    tracker.committed([first, second])
    kept[("t", 0)] = []  # their key's head was done, and they were handled
    assert [(tp.offset, tp.metadata) for tp in tracker.to_commit()] == [(10, "")]
