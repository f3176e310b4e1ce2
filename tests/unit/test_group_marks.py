"""The store a requests group's commits name, and which other store keeps one out."""

from __future__ import annotations

import pytest

from redrive.service import group_marks
from redrive.service.group_marks import CLAIM_EXPIRY_MS, Mark, OtherStore

pytestmark = pytest.mark.unit

ME = "a" * 32
OTHER = "b" * 32
THIRD = "c" * 32
NOW = 1_800_000_000_000
T = "redrive.requests"


def test_marks_read_back_as_written() -> None:
    assert group_marks.read(group_marks.settled(ME)) == Mark(ME)
    assert group_marks.read(group_marks.claim(ME, NOW)) == Mark(ME, NOW)
    assert Mark(ME).settled and not Mark(ME, NOW).settled


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        "",
        "rd1:AQI",  # an App's records done ahead, in a group of its own
        "redrive-store:",
        "redrive-store:" + "A" * 32,
        "redrive-store:" + "a" * 31,
        "redrive-store:" + "a" * 32 + " ",
        "redrive-claim:" + "a" * 32,
        "redrive-claim:" + "a" * 32 + ":soon",
    ],
)
def test_anything_else_names_no_store(metadata: str | None) -> None:
    assert group_marks.read(metadata) is None


def test_a_fresh_group_or_an_older_redrives_keeps_no_store_out() -> None:
    assert group_marks.other_store({}, ME, NOW) is None
    assert group_marks.other_store({(T, 0): None, (T, 1): None}, ME, NOW) is None
    assert not group_marks.held_by({(T, 0): None}, ME)


def test_the_stores_own_marks_keep_it_in() -> None:
    marks = {(T, 0): Mark(ME), (T, 1): Mark(ME, NOW), (T, 2): None}
    assert group_marks.other_store(marks, ME, NOW) is None
    assert group_marks.held_by(marks, ME)
    assert not group_marks.held_by({(T, 0): Mark(ME, NOW)}, ME)  # only claimed


def test_another_store_holding_the_group_keeps_it_out_named_with_its_partitions() -> None:
    marks = {(T, 0): Mark(OTHER), (T, 1): Mark(ME), (T, 2): Mark(OTHER), (T, 3): None}
    assert group_marks.other_store(marks, ME, NOW) == OtherStore(OTHER, True, ((T, 0), (T, 2)))


def test_another_store_claiming_keeps_out_a_store_that_does_not_hold_the_group() -> None:
    marks = {(T, 0): Mark(OTHER, NOW - 5), (T, 1): Mark(OTHER, NOW - 2), (T, 2): Mark(ME, NOW)}
    found = group_marks.other_store(marks, ME, NOW)
    assert found == OtherStore(OTHER, False, ((T, 0), (T, 1)), NOW - 2)


def test_a_claim_is_ignored_by_the_store_holding_the_group() -> None:
    # The claimer read after these marks were there: it refuses by itself.
    marks = {(T, 0): Mark(OTHER, NOW), (T, 1): Mark(ME)}
    assert group_marks.other_store(marks, ME, NOW) is None


def test_a_claim_left_behind_lapses() -> None:
    marks = {(T, 0): Mark(OTHER, NOW - CLAIM_EXPIRY_MS - 1)}
    assert group_marks.other_store(marks, ME, NOW) is None
    marks = {(T, 0): Mark(OTHER, NOW - CLAIM_EXPIRY_MS)}
    assert group_marks.other_store(marks, ME, NOW) is not None


def test_a_store_holding_the_group_is_named_before_one_claiming_it() -> None:
    marks = {
        (T, 0): Mark(THIRD, NOW),
        (T, 1): Mark(THIRD, NOW),
        (T, 2): Mark(OTHER),
    }
    assert group_marks.other_store(marks, ME, NOW) == OtherStore(OTHER, True, ((T, 2),))
