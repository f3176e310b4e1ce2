"""Every commit covers every hand-off made before it (:mod:`redrive.consumer.offsets`):
a partition has a position from its start in a run, not from its first record done,
and the records its last commit named done are named again until they are read
again. Either gap let a restarted App make a visible hand-off a second time."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition

from redrive.consumer.done_ahead import decode
from redrive.consumer.offsets import OffsetTracker

pytestmark = pytest.mark.unit


def test_a_resumed_partition_commits_the_records_done_while_its_first_still_runs() -> None:
    # Assigned at its committed offset 5: 5 runs (an async handler), 6 and 7 are put
    # behind their keys (their hand-offs in the transaction). The commit carries the
    # partition's offsets naming them, not nothing: else the next run reads from the
    # old commit and puts them behind again.
    done: dict[tuple[str, int], list[int]] = {("t", 0): [6, 7]}
    tracker = OffsetTracker()
    tracker.done_beyond = lambda partition: done.get(partition, [])
    tracker.resume([TopicPartition("t", 0, 5)])
    [commit] = tracker.to_commit()
    assert (commit.offset, decode(commit.metadata, 5)) == (5, {6, 7})


def test_a_partition_without_a_commit_is_positioned_at_its_first_record_read() -> None:
    done: dict[tuple[str, int], list[int]] = {}
    tracker = OffsetTracker()
    tracker.done_beyond = lambda partition: done.get(partition, [])
    tracker.resume([TopicPartition("t", 0, -1001)])  # nothing committed yet
    assert tracker.to_commit() == []
    tracker.reached(("t", 0), 40)  # the first record read: it runs
    tracker.reached(("t", 0), 41)  # put behind at once
    done[("t", 0)] = [41]
    [commit] = tracker.to_commit()
    assert (commit.offset, decode(commit.metadata, 40)) == (40, {41})
    tracker.mark(("t", 0), 41)  # both done: the position moves as before
    assert [tp.offset for tp in tracker.to_commit()] == [42]


@pytest.mark.parametrize("kept_lines", [False, True])
def test_what_the_last_commit_named_is_named_again_until_it_is_read_again(
    kept_lines: bool,
) -> None:
    # The last run committed 10 naming 12..15 done (their hand-offs are visible). This
    # run has dealt with 10 and 11 and not read 12..15 yet: a commit at 12 that named
    # nothing would have them handed off again after the next crash.
    unread = {("t", 0): {12, 13, 14, 15}}
    tracker = OffsetTracker()
    tracker.named_before = lambda partition: unread.get(partition, set())
    if kept_lines:
        tracker.kept = lambda partition: []
    else:
        tracker.done_beyond = lambda partition: []
    tracker.resume([TopicPartition("t", 0, 10)])  # its names: redrive.consumer.done_before
    tracker.mark(("t", 0), 11)
    [commit] = tracker.to_commit()
    assert (commit.offset, decode(commit.metadata, 12)) == (12, {12, 13, 14, 15})
    unread[("t", 0)] = {14, 15}  # 12 and 13 read again (skipped) and dealt with
    tracker.mark(("t", 0), 13)
    [commit] = tracker.to_commit()
    assert (commit.offset, decode(commit.metadata, 14)) == (14, {14, 15})


def test_a_kept_line_commit_names_what_the_last_commit_named_beyond_it() -> None:
    # Kept at 4 and 6 (position held at 4), 5 and 7..9 dealt with; 12 named by the
    # last commit and not read again yet.
    tracker = OffsetTracker()
    tracker.kept = lambda partition: [4, 6]
    tracker.named_before = lambda partition: {12}
    tracker.mark(("t", 0), 9)
    [commit] = tracker.to_commit()
    assert (commit.offset, sorted(decode(commit.metadata, 4))) == (4, [5, 7, 8, 9, 12])
