"""The service's collector settings still collect every cycle of garbage."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from redrive.service.garbage_collection import YOUNG_THRESHOLD, settle_after_start_up


@pytest.fixture
def settled() -> Iterator[None]:
    before = gc.get_threshold()
    settle_after_start_up()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: reference counting alone never frees it


def test_cycles_made_after_start_up_are_still_collected_without_asking(settled: None) -> None:
    collected = [0]

    def count() -> None:
        collected[0] += 1

    made = 3 * YOUNG_THRESHOLD  # enough allocations for young collections to run
    for _ in range(made):
        weakref.finalize(_Node(), count)
    # No gc.collect() here: the thresholds alone must have run the collector.
    assert collected[0] >= made - YOUNG_THRESHOLD * 2


def test_what_start_up_built_is_frozen_and_not_walked(settled: None) -> None:
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD
