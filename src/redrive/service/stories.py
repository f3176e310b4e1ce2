"""A record's story: from its first failure through each retry to its delivery or
dead letter, told from the steps the store keeps (:mod:`.store.history`).

Pure: steps (:class:`.store.Step`) in, stories out. A record is one (group, original
topic, partition, offset). Each retry request the service received for it is one
failed attempt: the request's `attempt` k says the k-th try failed (the first try is
the original delivery). A delivered retry is try k + 1; the consumer reports nothing when a try
succeeds, so a record whose last retry was delivered, with no failure after it, is
told as delivered on that try. A dead letter ends the story; a pending retry leaves
it waiting.

A dead letter that was replayed, or came back dead from a replay, has the rounds of
its line too (``rounds``, from :mod:`.store.replay_rounds`: the loop guard's record):
each replay (round n, when, by whom, to where) and what came back of it (which dead
letter, when, with which error). A replayed copy is a new record with a story of its
own; the rounds tie the stories together.

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
from redrive.service.store import ReplayRound, Step

RecordId = tuple[str | None, str | None, int | None, int | None]


def _ms(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", errors="replace")


def _record_of(step: Step) -> RecordId | tuple[str, int]:
    if step.original_topic is None or step.original_offset is None:
        return ("step", step.id)  # nothing to tie it to others: a story alone
    return (step.group_id, step.original_topic, step.original_partition, step.original_offset)


def _failure(step: Step) -> dict[str, Any]:
    if step.kind == "dead":
        error_type, message = step.error_type, step.error_message
    else:
        redrive, _ = split_headers(step.headers)
        error_type, message = _text(redrive.get(ERROR_TYPE)), _text(redrive.get(ERROR_MESSAGE))
    return {
        "event": "failed",
        "attempt": step.attempt,
        "at_ms": _ms(step.received_at or step.ended_at),
        "error_type": error_type,
        "error_message": message,
    }


def story(steps: list[Step]) -> dict[str, Any]:
    """The story of one record from its steps (in attempt order)."""
    first, last = steps[0], steps[-1]
    events: list[dict[str, Any]] = []
    for step in steps:
        events.append(_failure(step))
        if step.kind == "dead":
            events.append(
                {
                    "event": "dead_letter",
                    "at_ms": _ms(step.ended_at),
                    "dead_letter_id": step.id,
                    "reason_code": step.reason_code,
                    "reason": step.reason,
                }
            )
            continue
        # A retry (pending or delivered) always has a due time; only a dead letter has none.
        due_ms = step.due_ms or 0
        received = _ms(step.received_at)
        events.append(
            {
                "event": "scheduled",
                "attempt": step.attempt + 1,
                "due_ms": step.due_ms,
                "delay_ms": None if received is None else due_ms - received,
                "pending_id": step.id,
            }
        )
        if step.kind == "delivered":
            events.append(
                {"event": "delivered", "attempt": step.attempt + 1, "at_ms": _ms(step.ended_at)}
            )
    state = last.kind
    attempts = max(s.attempt for s in steps) + (1 if state == "delivered" else 0)
    return {
        "group": first.group_id,
        "topic": first.original_topic,
        "partition": first.original_partition,
        "offset": first.original_offset,
        "key": first.msg_key,
        "destination": last.topic,
        "state": state,
        "attempts": attempts,
        "events": events,
    }


def stories(steps: Iterable[Step]) -> list[dict[str, Any]]:
    """One story per record, in the order the steps come (the store sorts them)."""
    return [story(list(group)) for _, group in groupby(steps, key=_record_of)]


def dead_letter_of(story: dict[str, Any]) -> int | None:
    """The id of the dead letter a story ends with (None: it ends otherwise)."""
    ids = [e["dead_letter_id"] for e in story["events"] if e["event"] == "dead_letter"]
    return ids[-1] if ids else None


def round_told(row: ReplayRound) -> dict[str, Any]:
    """One round of a letter's line as a story tells it."""
    return {
        "round": row.round,
        "dead_letter_id": row.letter_id,
        "replayed_at_ms": _ms(row.replayed_at),
        "actor": row.actor,
        "job": row.job_id,
        "topic": row.topic,
        "partition": row.kafka_partition,
        "came_back_as": row.returned_id,
        "came_back_at_ms": _ms(row.returned_at),
        "error_type": row.error_type,
        "error_message": row.error_message,
    }


def with_rounds(
    found: list[dict[str, Any]], rounds: dict[int, list[ReplayRound]]
) -> list[dict[str, Any]]:
    """The stories, each with the rounds of its dead letter's line (none: [])."""
    for story in found:
        letter = dead_letter_of(story)
        story["rounds"] = [round_told(r) for r in rounds.get(letter, [])] if letter else []
    return found
