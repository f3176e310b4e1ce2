"""A record's story from its steps: attempts counted, events in order, any bytes read."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redrive.service.store import Step
from redrive.service.stories import stories

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def step(kind: str, attempt: int, **fields: Any) -> Step:
    base: dict[str, Any] = {
        "kind": kind,
        "id": attempt,
        "topic": "orders",
        "msg_key": b"order-42",
        "headers": [("redrive-error-type", b"billing.Timeout"), ("redrive-error-message", b"slow")],
        "attempt": attempt,
        "group_id": "billing",
        "original_topic": "orders",
        "original_partition": 1,
        "original_offset": 7,
        "due_ms": int(T0.timestamp() * 1000) + 1000 * attempt,
        "received_at": T0,
        "ended_at": T0 if kind != "pending" else None,
        "reason_code": None,
        "reason": None,
        "error_type": None,
        "error_message": None,
    }
    return Step(**{**base, **fields})


def test_failed_twice_then_delivered_is_three_attempts() -> None:
    [story] = stories([step("delivered", 1), step("delivered", 2)])
    assert (story["state"], story["attempts"]) == ("delivered", 3)
    assert [e["event"] for e in story["events"]] == ["failed", "scheduled", "delivered"] * 2
    assert [e["attempt"] for e in story["events"] if e["event"] == "delivered"] == [2, 3]
    assert story["events"][0]["error_type"] == "billing.Timeout"


def test_a_dead_letter_ends_it_and_a_pending_retry_leaves_it_waiting() -> None:
    dead = step("dead", 3, headers=[], error_type="billing.Bad", reason_code="attempts_exhausted")
    [ended] = stories([step("delivered", 1), step("delivered", 2), dead])
    assert (ended["state"], ended["attempts"]) == ("dead", 3)
    assert ended["events"][-1]["event"] == "dead_letter"
    assert ended["events"][-2] == {**ended["events"][-2], "error_type": "billing.Bad"}
    [waiting] = stories([step("delivered", 1), step("pending", 2)])
    assert (waiting["state"], waiting["attempts"]) == ("pending", 2)
    assert waiting["events"][-1]["event"] == "scheduled"


def test_records_are_told_apart_and_steps_without_coordinates_stand_alone() -> None:
    other = step("delivered", 1, original_offset=8)
    loose = [step("dead", 1, id=i, original_topic=None, original_offset=None) for i in (50, 51)]
    told = stories([step("delivered", 1), other, *loose])
    assert [s["offset"] for s in told] == [7, 8, None, None]


@given(st.lists(st.tuples(st.text(max_size=20), st.none() | st.binary(max_size=40)), max_size=6))
def test_any_header_bytes_are_read(headers: list[tuple[str, bytes | None]]) -> None:
    [story] = stories([step("delivered", 1, headers=headers)])
    failed = story["events"][0]
    assert failed["event"] == "failed"
    assert failed["error_message"] is None or isinstance(failed["error_message"], str)
