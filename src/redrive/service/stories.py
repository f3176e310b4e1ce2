"""A record's story: from its first failure through each retry to its delivery or
dead letter, told from the steps the store keeps (:mod:`.store.history`).

Pure: rows in, stories out. A record is one (group, original topic, partition,
offset). Each retry request the service received for it is one failed attempt: the
request's `attempt` k says the k-th try failed (the first try is the original
delivery). A delivered retry is try k + 1; the consumer reports nothing when a try
succeeds, so a record whose last retry was delivered, with no failure after it, is
told as delivered on that try. A dead letter ends the story; a pending retry leaves
it waiting.

Times are the service's: a failure is dated when the service received its request
(the failure is at most that old), and a retry's `delay_ms` is its due time minus
that (negative when the request arrived already due).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from itertools import groupby
from typing import Any

from redrive.headers import ERROR_MESSAGE, ERROR_TYPE, split_headers
from redrive.service.store import Row

RecordId = tuple[str | None, str | None, int | None, int | None]


def _ms(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", errors="replace")


def _record_of(row: Row) -> RecordId | tuple[str, int]:
    if row["original_topic"] is None or row["original_offset"] is None:
        return ("step", int(row["id"]))  # nothing to tie it to others: a story alone
    return (
        row["group_id"],
        row["original_topic"],
        row["original_partition"],
        row["original_offset"],
    )


def _failure(row: Row) -> dict[str, Any]:
    if row["kind"] == "dead":
        error_type, message = row["error_type"], row["error_message"]
    else:
        redrive, _ = split_headers(row["headers"])
        error_type, message = _text(redrive.get(ERROR_TYPE)), _text(redrive.get(ERROR_MESSAGE))
    return {
        "event": "failed",
        "attempt": row["attempt"],
        "at_ms": _ms(row["received_at"] or row["ended_at"]),
        "error_type": error_type,
        "error_message": message,
    }


def story(rows: list[Row]) -> dict[str, Any]:
    """The story of one record from its steps (in attempt order)."""
    first, last = rows[0], rows[-1]
    events: list[dict[str, Any]] = []
    for row in rows:
        events.append(_failure(row))
        if row["kind"] == "dead":
            events.append(
                {
                    "event": "dead_letter",
                    "at_ms": _ms(row["ended_at"]),
                    "dead_letter_id": row["id"],
                    "reason_code": row["reason_code"],
                    "reason": row["reason"],
                }
            )
            continue
        received = _ms(row["received_at"])
        events.append(
            {
                "event": "scheduled",
                "attempt": row["attempt"] + 1,
                "due_ms": row["due_ms"],
                "delay_ms": None if received is None else row["due_ms"] - received,
                "pending_id": row["id"],
            }
        )
        if row["kind"] == "delivered":
            events.append(
                {"event": "delivered", "attempt": row["attempt"] + 1, "at_ms": _ms(row["ended_at"])}
            )
    state = last["kind"]
    attempts = max(r["attempt"] for r in rows) + (1 if state == "delivered" else 0)
    return {
        "group": first["group_id"],
        "topic": first["original_topic"],
        "partition": first["original_partition"],
        "offset": first["original_offset"],
        "key": first["msg_key"],
        "destination": last["topic"],
        "state": state,
        "attempts": attempts,
        "events": events,
    }


def stories(rows: Iterable[Row]) -> list[dict[str, Any]]:
    """One story per record, in the order the rows come (the store sorts them)."""
    return [story(list(steps)) for _, steps in groupby(rows, key=_record_of)]
