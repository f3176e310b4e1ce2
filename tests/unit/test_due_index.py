"""Where the Spark scheduler's buckets file pending messages (redrive.spark.due_index).

The index is checked against a plain model (every pending due time in a list) through
random sequences of what the scheduler does: file a batch of messages, fire the timer
at some time, and read back what was filed. The properties are the ones delivery
depends on: the timer is always at the earliest pending due time (never early, never
missing), a fired timer hands over exactly the messages due, and the index survives
its trip through the state store's bytes.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redrive.spark.due_index import SLOT_MS, DueIndex, slot_of
from redrive.spark.output import OutputRecord
from redrive.spark.pending_messages import PendingMessage, pack, unpack

pytestmark = pytest.mark.unit

due_times = st.integers(0, 20 * SLOT_MS)
# What happens to a bucket: a batch files messages due at these times, or the
# timer fires at a given time.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("file"), st.lists(due_times, min_size=1, max_size=8)),
        st.tuples(st.just("fire"), due_times),
    ),
    max_size=40,
)


class Bucket:
    """The scheduler's use of the index, with the slots kept in a dict (the MapState)."""

    def __init__(self) -> None:
        self.index = DueIndex()
        self.slots_state: dict[int, list[int]] = {}
        self.timer: int | None = None  # what Spark has registered

    def save(self) -> None:
        change = self.index.arm()
        if change.delete is not None:
            assert change.delete == self.timer, "deleted a timer that is not registered"
            self.timer = None
        if change.register is not None:
            self.timer = change.register
        # Through the state store's bytes, as between two batches.
        self.index = DueIndex.from_bytes(self.index.to_bytes())

    def file(self, dues: list[int]) -> None:
        by_slot: dict[int, list[int]] = {}
        for due in dues:
            by_slot.setdefault(slot_of(due), []).append(due)
        for slot, filed in by_slot.items():
            if slot in self.index.slots:
                assert slot in self.slots_state, "the index has a slot the state does not"
                filed = self.slots_state[slot] + filed
            self.slots_state[slot] = filed
            self.index.file(slot, min(filed))
        self.save()

    def fire(self, now: int) -> list[int]:
        assert self.timer is not None and self.timer <= now
        self.index.fired(self.timer)
        self.timer = None
        delivered: list[int] = []
        for slot in self.index.due_slots(now):
            messages = self.slots_state.pop(slot)
            rest = [due for due in messages if due > now]
            delivered += [due for due in messages if due <= now]
            if rest:
                self.slots_state[slot] = rest
            self.index.file(slot, min(rest, default=None))
        self.save()
        return delivered


@given(steps)
def test_the_timer_is_always_at_the_earliest_pending_message(script: list[tuple]) -> None:
    bucket = Bucket()
    pending: list[int] = []  # the model
    for action, argument in script:
        if action == "file":
            bucket.file(argument)
            pending += argument
        elif bucket.timer is not None and argument >= bucket.timer:
            delivered = bucket.fire(argument)
            assert sorted(delivered) == sorted(d for d in pending if d <= argument)
            assert delivered, "the timer fired with nothing due"
            pending = [d for d in pending if d > argument]
        assert bucket.timer == min(pending, default=None)
        filed = sorted(d for part in bucket.slots_state.values() for d in part)
        assert filed == sorted(pending), "a message was lost or doubled"
        assert set(bucket.index.slots) == set(bucket.slots_state)


def test_a_due_time_outside_its_slot_is_refused() -> None:
    index = DueIndex()
    with pytest.raises(ValueError, match="not in slot"):
        index.file(3, 2 * SLOT_MS)
    index.file(2, 2 * SLOT_MS + 5)
    assert index.slots == {2: 2 * SLOT_MS + 5}


def test_an_empty_index_round_trips_and_arms_nothing() -> None:
    assert DueIndex.from_bytes(None) == DueIndex()
    assert DueIndex.from_bytes(DueIndex().to_bytes()) == DueIndex()
    change = DueIndex().arm()
    assert (change.delete, change.register) == (None, None)


keys = st.none() | st.binary(max_size=20)
messages = st.builds(
    PendingMessage,
    st.integers(0, 2**62),
    st.builds(
        OutputRecord,
        st.text(min_size=1, max_size=20),
        keys,
        keys,
        st.lists(st.tuples(st.text(max_size=10), keys), max_size=3),
        st.none() | st.integers(0, 1000),
    ),
    st.none() | st.integers(0, 2**62),
    st.tuples(st.text(min_size=1, max_size=10), st.integers(0, 1000), st.integers(0, 2**40)),
)


@given(st.lists(messages, max_size=10))
def test_packed_messages_come_back_unchanged(batch: list[PendingMessage]) -> None:
    assert unpack(pack(batch)) == batch
