"""The async handlers' in-flight book against a plain model: whatever order records end
in, a partition's position never passes a record accepted and not done, and reaches
every record once all before it are done."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redrive.consumer.in_flight import InFlight

pytestmark = pytest.mark.unit

P = ("orders", 0)
Q = ("orders", 1)


def test_the_position_waits_for_the_oldest_record() -> None:
    book = InFlight()
    for offset in (10, 11, 12):
        book.accept(P, offset)
    assert book.count == 3
    assert book.done(P, 12) is None  # 10 and 11 still open
    assert book.done(P, 10) == 10
    assert book.done(P, 11) == 12  # 12 was done already
    assert book.count == 0
    assert book.done(P, 11) is None  # twice: ignored


def test_dropped_records_hold_the_position_below_them() -> None:
    book = InFlight()
    for offset in (5, 6, 7):
        book.accept(P, offset)
    assert book.done(P, 5) == 5
    book.drop_from(P, 6)  # 6 failed and its partition was sought back to it
    assert book.count == 0
    book.accept(P, 6)  # fetched again
    assert book.done(P, 6) == 6


def test_a_given_up_record_keeps_the_position_below_it_for_good() -> None:
    book = InFlight()
    for offset in (1, 2, 3):
        book.accept(P, offset)
    book.give_up(P, 1)
    assert book.count == 2
    assert book.done(P, 2) is None and book.done(P, 3) is None
    assert book.open_in(lambda tp: True) == []


def test_forgotten_partitions_are_ignored_afterwards() -> None:
    book = InFlight()
    book.accept(P, 1)
    book.accept(Q, 1)
    book.forget({P})
    assert book.count == 1
    assert book.done(P, 1) is None
    assert book.open_in(lambda tp: True) == [Q]
    assert book.done(Q, 1) == 1


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_matches_a_plain_model(data: st.DataObject) -> None:
    """Random accepts (in offset order per partition), ends in any order, drops of the
    open tail: the book's positions are the model's."""
    book = InFlight()
    accepted: dict[tuple[str, int], list[int]] = {P: [], Q: []}
    state: dict[tuple[str, int], dict[int, str]] = {P: {}, Q: {}}
    next_offset = {P: 0, Q: 0}
    marked: dict[tuple[str, int], int] = {}
    for _ in range(data.draw(st.integers(1, 60))):
        partition = data.draw(st.sampled_from([P, Q]))
        action = data.draw(st.sampled_from(["accept", "accept", "done", "drop", "give_up"]))
        open_ = [o for o, s in state[partition].items() if s == "open"]
        if action == "accept" or not open_:
            offset = next_offset[partition]
            next_offset[partition] += 1
            book.accept(partition, offset)
            accepted[partition].append(offset)
            state[partition][offset] = "open"
        elif action == "done":
            offset = data.draw(st.sampled_from(open_))
            state[partition][offset] = "done"
            moved = book.done(partition, offset)
            if moved is not None:
                assert moved > marked.get(partition, -1)
                marked[partition] = moved
        elif action == "drop":
            # Only the open tail is ever dropped (a failure in a lane kept in order).
            tail = [o for o in sorted(state[partition]) if o >= max(open_)]
            start = max(open_)
            book.drop_from(partition, start)
            for offset in tail:
                del state[partition][offset]
            next_offset[partition] = start  # fetched again from there
        else:
            offset = data.draw(st.sampled_from(open_))
            book.give_up(partition, offset)
            state[partition][offset] = "given up"
        # The model: the position is the last offset of the done prefix.
        for part in (P, Q):
            prefix = -1
            for offset in sorted(state[part]):
                if state[part][offset] != "done":
                    break
                prefix = offset
            assert marked.get(part, -1) == prefix, (part, state[part], marked)
            # What a commit at that position names as done beyond it.
            beyond = [o for o in sorted(state[part]) if o > prefix and state[part][o] == "done"]
            assert book.done_beyond(part) == beyond
        assert book.count == sum(s == "open" for m in state.values() for s in m.values())


def test_it_holds_a_record_only_while_it_is_open_here() -> None:
    book = InFlight()
    tp = ("t", 0)
    assert not book.holds(tp, 1)
    book.accept(tp, 1)
    book.accept(tp, 2)
    book.accept(tp, 3)
    assert book.holds(tp, 1)
    book.done(tp, 1)
    book.give_up(tp, 2)
    assert not book.holds(tp, 1) and not book.holds(tp, 2) and book.holds(tp, 3)
    book.forget({tp})
    assert not book.holds(tp, 3)
