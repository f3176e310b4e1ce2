"""When the App subscribes again: only while partitions were lost and no assignment
came for the whole wait, and then once per wait."""

from __future__ import annotations

import pytest

from redrive.rejoin import RejoinWatch

pytestmark = pytest.mark.unit


def test_an_app_given_its_partitions_back_is_left_alone() -> None:
    watch = RejoinWatch(after_s=60)
    assert not watch.due(1_000)  # never lost anything
    watch.lost(0)
    watch.assigned()  # back in the group (even with no partitions)
    assert not watch.due(1_000)


def test_an_app_left_out_subscribes_again_once_per_wait() -> None:
    watch = RejoinWatch(after_s=60)
    watch.lost(100)
    watch.lost(130)  # lost again meanwhile: the wait counts from the first
    assert not watch.due(159)
    assert watch.due(160)
    assert not watch.due(200)  # the wait starts over
    assert watch.due(220)
    watch.assigned()
    assert not watch.due(1_000)
