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
    window.stage("retried")
    window.stage("dead")
    assert "retried" not in window  # not before the commit: an abort would lose it
    window.abort()
    window.commit()
    assert "retried" not in window and "dead" not in window
    window.stage("retried")
    window.stage("dead")
    window.commit()
    assert "retried" in window and "dead" in window
    # Their releases went with the commit: a repeat does not release again.
    assert not window.left_queue("dead") and not window.left_queue("retried")


def test_without_transactions_a_repeat_of_a_record_that_left_its_queue_releases_it() -> None:
    window = RecentIds(10)
    window.add("handled")
    window.add("dead", done=True)
    window.add("retried", done=False)
    # The first release may be lost; one that went on to its next retry still heads
    # its queue.
    assert window.left_queue("handled") and window.left_queue("dead")
    assert not window.left_queue("retried") and not window.left_queue("unknown")


def test_with_transactions_a_handled_record_releases_again_only_until_its_commit() -> None:
    window = RecentIds(10)
    # As the App remembers a handled delivery in a transaction: a repeat at once (one
    # arriving before the commit is skipped), its release settled by the commit.
    window.add("handled")
    window.stage("handled")
    assert "handled" in window and window.left_queue("handled")
    window.abort()  # the release went with the transaction: a repeat releases again
    assert "handled" in window and window.left_queue("handled")
    window.add("next")
    window.stage("next")
    window.commit()
    assert "next" in window and not window.left_queue("next")
