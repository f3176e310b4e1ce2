"""The App's held keys (``ordering="key"``), without a broker: a key is held from the
hand-off of one of its records until the App is done with the last one it handed off,
and every change is written to the held-keys topic (the last write per key is what
a restart reads back)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redrive.consumer.held_keys import FailedRun, HeldKeys, parse_held
from redrive.consumer.publisher import Publisher

pytestmark = pytest.mark.unit


class Written:
    """What HeldKeys writes, by (topic, partition, key): the last value (None: tombstone)."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, int, bytes], bytes | None] = {}

    def put(self, topic: str, *, key: bytes, value: bytes | None, partition: int) -> None:
        self.last[(topic, partition, key)] = value


def held_keys() -> tuple[HeldKeys, Written]:
    written = Written()
    return HeldKeys(cast(Publisher, written), {"items": "g.items.held"}), written


def test_a_key_is_free_once_its_last_handed_off_record_is_done() -> None:
    held, written = held_keys()
    held.hold("items", 2, b"k", 40)  # a retry
    held.hold("items", 2, b"k", 41)  # a record behind it
    held.hold("items", 2, b"k", 40)  # the retry failing again: still held at 41
    assert held.last("items", 2, b"k") == 41
    assert written.last[("g.items.held", 2, b"k")] == b"41"
    assert not held.done("items", 2, b"k", 40)  # 41 still waits
    assert held.last("items", 2, b"k") == 41
    assert held.done("items", 2, b"k", 41)
    assert held.last("items", 2, b"k") is None
    assert written.last[("g.items.held", 2, b"k")] is None  # a tombstone
    # The same key on another partition is another key; done again changes nothing.
    assert held.last("items", 3, b"k") is None
    assert not held.done("items", 2, b"k", 41)


def test_forgotten_partitions_hold_nothing() -> None:
    held, _ = held_keys()
    held.hold("items", 0, b"a", 1)
    held.hold("items", 1, b"b", 1)
    held.forget([("items", 0)])
    assert held.last("items", 0, b"a") is None
    assert held.last("items", 1, b"b") == 1
    assert held.count("items") == 1


def test_the_run_that_failed_on_a_key_is_remembered_until_the_key_is_free() -> None:
    held, written = held_keys()
    held.hold("items", 2, b"k", 40)  # a first failure: no run
    assert held.dropping("items", 2, b"k") is None
    held.hold("items", 2, b"k", 41)  # a record behind it
    held.hold("items", 2, b"k", 40, run=7)  # 40 failing again in run 7
    assert held.dropping("items", 2, b"k") == FailedRun(7, 40)
    assert held.last("items", 2, b"k") == 41
    assert written.last[("g.items.held", 2, b"k")] == b"41 7 40"
    held.hold("items", 2, b"k", 42)  # read behind: the failed run stays
    assert written.last[("g.items.held", 2, b"k")] == b"42 7 40"
    del written.last[("g.items.held", 2, b"k")]
    held.hold("items", 2, b"k", 40, run=7)  # the same hand-off read again: no write
    assert ("g.items.held", 2, b"k") not in written.last
    held.hold("items", 2, b"k", 41, run=9)  # the next run failing at 41
    assert written.last[("g.items.held", 2, b"k")] == b"42 9 41"
    assert held.dropping("items", 3, b"k") is None  # another partition's key
    assert held.done("items", 2, b"k", 42)
    assert held.dropping("items", 2, b"k") is None
    assert written.last[("g.items.held", 2, b"k")] is None
    assert parse_held(b"41") == (41, None)  # as written before runs


@pytest.mark.parametrize("value", [b"", b"x", b"4 ", b"4 5", b"4 5 x", b"4 5 6 7", b" 4", b"4  5"])
def test_a_held_value_that_is_not_an_offset_and_a_failed_run_is_refused(value: bytes) -> None:
    with pytest.raises(ValueError):
        parse_held(value)


events = st.lists(
    st.tuples(st.sampled_from(["hold", "done", "fail"]), st.sampled_from([b"a", b"b"])),
    max_size=60,
)


@given(events)
def test_held_matches_a_plain_model_and_what_a_restart_reads_back(
    steps: list[tuple[str, bytes]],
) -> None:
    """Records are handed off in offset order; the App is done with them in the order
    the service delivers them (the same). A key is held while one handed off is not
    done; what was written last per key says the same."""
    held, written = held_keys()
    handed: dict[bytes, list[int]] = {b"a": [], b"b": []}
    failed: dict[bytes, FailedRun] = {}
    for offset, (step, key) in enumerate(steps):
        if step == "hold":
            held.hold("items", 0, key, offset)
            handed[key].append(offset)
        elif step == "fail" and handed[key]:  # the next of the key failing again, in a run
            held.hold("items", 0, key, handed[key][0], run=offset)
            failed[key] = FailedRun(offset, handed[key][0])
        elif step == "done" and handed[key]:
            held.done("items", 0, key, handed[key].pop(0))
            if not handed[key]:
                failed.pop(key, None)
    for key, waiting in handed.items():
        expected: Any = (waiting[-1], failed.get(key)) if waiting else None
        found = held.last("items", 0, key)
        assert (found, held.dropping("items", 0, key)) == (expected or (None, None))
        value = written.last.get(("g.items.held", 0, key))
        assert (parse_held(value) if value is not None else None) == expected
