"""The window of recently handled redrive-ids: bounded, the oldest forgotten first."""

from __future__ import annotations

import pytest

from redrive import App
from redrive.consumer.repeats import RecentIds
from redrive.errors import ConfigError

pytestmark = pytest.mark.unit


def test_the_window_keeps_the_last_ids_only() -> None:
    window = RecentIds(3)
    for name in "abcd":
        window.add(name)
    assert "a" not in window and all(name in window for name in "bcd")
    window.add("b")  # already there: nothing moves, nothing is forgotten
    assert len(window) == 3 and "b" in window
    window.add("e")
    assert "b" not in window and "e" in window


def test_an_empty_window_remembers_nothing() -> None:
    window = RecentIds(0)
    window.add("a")
    assert "a" not in window and len(window) == 0


@pytest.mark.parametrize("size", [-1, 1.5, "10", None, True])
def test_a_bad_window_is_refused(size: object) -> None:
    with pytest.raises(ConfigError, match="repeat_window"):
        App("localhost:1", group="g", repeat_window=size)  # type: ignore[arg-type]


def test_a_handed_off_failure_counts_once_its_transaction_commits() -> None:
    window = RecentIds(10)
    window.stage("retried", done=False)
    window.stage("dead", done=True)
    assert "retried" not in window  # not before the commit: an abort would lose it
    window.abort()
    window.commit()
    assert "retried" not in window and "dead" not in window
    window.stage("retried", done=False)
    window.stage("dead", done=True)
    window.add("handled")
    window.commit()
    assert all(name in window for name in ("retried", "dead", "handled"))
    # A repeat of a record that left its key's queue releases it again; one that went
    # on to its next retry does not (it still heads its queue).
    assert window.left_queue("dead") and window.left_queue("handled")
    assert not window.left_queue("retried") and not window.left_queue("unknown")
