"""How dead letters and pending retries are shown: the REST API's JSON, which the
web pages show too.

A payload is given every way an operator may want to read it: text (when it is
UTF-8), parsed JSON (when it is JSON, not too deeply nested), hex and base64.
"""

from __future__ import annotations

import base64
import contextlib
import json
from datetime import UTC, datetime
from typing import Any

from redrive.headers import is_redrive_header
from redrive.service.replay_preview import Preview
from redrive.service.store import (
    AuditRecord,
    DeadLetter,
    Pending,
    ReplayJob,
    ReplayRound,
    StoredMessage,
)
from redrive.service.stories import round_told

HEX_PREVIEW_BYTES = 64 * 1024
# A payload's JSON is shown parsed only up to this nesting: responses are serialized
# by pydantic, which refuses values nested deeper than about 250 levels; the text,
# hex and base64 forms still carry the payload.
MAX_JSON_NESTING = 100


def _utf8(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def render_bytes(raw: bytes | None) -> dict[str, Any] | None:
    """A payload as an operator wants to see it: text, JSON, hex, base64."""
    if raw is None:
        return None
    text = _utf8(raw)
    out: dict[str, Any] = {
        "size": len(raw),
        "base64": base64.b64encode(raw).decode(),
        "text": text,
        "json": None,
    }
    if text is not None:
        # RecursionError: nesting deeper than the parser's stack (a producer can send it).
        with contextlib.suppress(ValueError, RecursionError):
            parsed = json.loads(text)
            if _nesting(parsed) <= MAX_JSON_NESTING:
                out["json"] = parsed
    out["hex"] = raw[:HEX_PREVIEW_BYTES].hex()
    out["hex_truncated"] = len(raw) > HEX_PREVIEW_BYTES
    return out


def _nesting(value: Any) -> int:
    """How deeply arrays and objects nest in a parsed JSON value (without recursion)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            depth += 1
            deepest = max(deepest, depth)
            stack += [
                (child, depth) for child in (item.values() if isinstance(item, dict) else item)
            ]
    return deepest


def render_headers(headers: list[tuple[str, bytes | None]]) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "text": None if value is None else _utf8(value),
            "base64": None if value is None else base64.b64encode(value).decode(),
        }
        for name, value in headers
    ]


def _time(value: Any) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else None


def _original(row: StoredMessage) -> dict[str, Any]:
    """Where the record was first consumed."""
    return {
        "topic": row.original_topic,
        "partition": row.original_partition,
        "offset": row.original_offset,
    }


def dead_letter_summary(row: DeadLetter) -> dict[str, Any]:
    key = row.msg_key
    return {
        "id": row.id,
        "topic": row.topic,
        "group": row.group_id,
        "error_type": row.error_type,
        "error_message": row.error_message,
        "reason_code": row.reason_code,
        "reason": row.reason,
        "attempt": row.attempt,
        "key": _utf8(key) if key is not None else None,
        "dead_at": _time(row.dead_at),
        "replays": row.replays,
        "replay_of": row.replay_of,
        "quarantined": row.quarantined,
        "quarantined_at": _time(row.quarantined_at),
        "record_missing": row.record_missing,
    }


def dead_letter_detail(row: DeadLetter) -> dict[str, Any]:
    return {
        **dead_letter_summary(row),
        "key": render_bytes(row.msg_key),
        "value": render_bytes(row.msg_value),
        "headers": render_headers(row.headers),
        "error_trace": row.error_trace,
        "error_group": row.error_group,
        "fingerprint": row.fingerprint,
        "source": row.source,
        "original": {**_original(row), "timestamp": row.original_timestamp},
        "request": {
            "topic": row.request_topic,
            "partition": row.request_partition,
            "offset": row.request_offset,
        },
    }


def order_state(row: Pending) -> str | None:
    """Where a pending retry stands in its key's queue: None (it keeps no order),
    "head" (next to go, at its due time), "delivered" (out, awaiting its consumer),
    "behind" (held until the rows before it are done)."""
    if row.order_queue is None:
        return None
    if row.delivered_ms is not None:
        return "delivered"
    return "behind" if row.held else "head"


def queue_view(row: Pending) -> dict[str, Any] | None:
    """The key queue of a pending retry: its id (hex), its head's id, how many rows it
    holds and how many of them wait behind the head; with this row's place (0: the
    head) when it was counted."""
    if row.order_queue is None:
        return None
    length = row.queue_length
    out: dict[str, Any] = {
        "id": row.order_queue.hex(),
        "head_id": row.queue_head_id,
        "length": length,
        "behind": max(length - 1, 0),
    }
    if row.queue_position is not None:
        out["position"] = row.queue_position
    return out


def pending_view(row: Pending, *, full: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": row.id,
        "due_ms": row.due_ms,
        "destination": row.destination,
        "partition": row.dest_partition,
        "attempt": row.attempt,
        "group": row.group_id,
        "deadline_ms": row.deadline_ms,
        "received_at": _time(row.received_at),
        "order_state": order_state(row),
        "delivered_ms": row.delivered_ms,
        "queue": queue_view(row),
    }
    if full:
        out |= {
            "key": render_bytes(row.msg_key),
            "value": render_bytes(row.msg_value),
            "headers": render_headers(row.headers),
            "original": _original(row),
        }
    return out


def queue_item(row: Pending) -> dict[str, Any]:
    """A row of a key queue's listing: the pending summary, with the original record's
    coordinates (the queue's order) and its place in the queue."""
    return {
        **pending_view(row, full=False),
        "position": row.queue_position,
        "original": _original(row),
    }


def audit_entry(row: AuditRecord) -> dict[str, Any]:
    return {
        "id": row.id,
        "at": _time(row.at),
        "actor": row.actor,
        "role": row.role,
        "action": row.action,
        "ids": list(row.ids),
        "filter": row.filter,
        "count": row.count,
        "detail": row.detail,
    }


def replay_job_view(row: ReplayJob) -> dict[str, Any]:
    """A replay job as the API and the job page show it: what was asked, and how far
    it got (`settled` letters of `total`: sent, failed, gone or cancelled)."""
    counts = {
        "sent": row.sent,
        "failed": row.failed,
        "gone": row.gone,
        "cancelled": row.cancelled,
        "skipped": row.skipped,
    }
    settled = sum(counts.values())
    return {
        "id": row.id,
        "state": row.state,
        "actor": row.actor,
        "role": row.role,
        "destination": row.destination,
        "keep": row.keep,
        "rate": row.rate,
        "filter": row.filter,
        "total": row.total,
        **counts,
        "settled": settled,
        "progress": settled / row.total if row.total else 1.0,
        "created_at": _time(row.created_at),
        "start_at": _time(row.start_at),
        "started_at": _time(row.started_at),
        "finished_at": _time(row.finished_at),
        "cancelled_by": row.cancelled_by,
        "failures": [
            {"dead_letter_id": f.dead_letter_id, "error": f.error, "state": f.state}
            for f in row.failures
        ],
    }


def _round_shown(told: dict[str, Any]) -> dict[str, Any]:
    return {
        **told,
        "replayed_at": _iso_ms(told["replayed_at_ms"]),
        "came_back_at": _iso_ms(told["came_back_at_ms"]),
    }


def rounds_view(rows: list[ReplayRound]) -> list[dict[str, Any]]:
    """The loop guard's rounds of a letter's line (as a story tells them), first first."""
    return [_round_shown(round_told(row)) for row in rows]


def preview_view(shown: Preview) -> dict[str, Any]:
    """A dry run (service/replay_preview.py) as the API answers it and the UI shows it."""
    return {
        "dry_run": True,
        "selected": shown.selected,
        "would_send": shown.would_send,
        "remaining": shown.remaining,
        "destinations": [
            {"topic": topic, "partition": partition, "count": count}
            for (topic, partition), count in sorted(
                shown.sends.items(), key=lambda item: (item[0][0], item[0][1] is None, item[0][1])
            )
        ],
        "sample": [
            {
                "dead_letter_id": one.letter_id,
                "key": render_bytes(one.key),
                "topic": one.topic,
                "partition": one.partition,
                "headers": render_headers(one.headers),
            }
            for one in shown.sample
        ],
        "stripped_headers": [
            {"name": name, "letters": count, "redrive": is_redrive_header(name)}
            for name, count in sorted(shown.stripped.items())
        ],
        "refused": [{"dead_letter_id": p.letter_id, "reason": p.reason} for p in shown.refused],
        "skipped": [{"dead_letter_id": p.letter_id, "reason": p.reason} for p in shown.skipped],
        "conflict": shown.conflict,
    }


def _iso_ms(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat()


def story_view(story: dict[str, Any]) -> dict[str, Any]:
    """A record's story (service/stories.py) with its key rendered and its times
    given both as epoch milliseconds and ISO 8601."""
    events = []
    for event in story["events"]:
        shown = dict(event)
        for name in ("at_ms", "due_ms"):
            if name in shown:
                shown[name.removesuffix("_ms")] = _iso_ms(shown[name])
        events.append(shown)
    rounds = [_round_shown(told) for told in story.get("rounds", [])]
    return {**story, "key": render_bytes(story["key"]), "events": events, "rounds": rounds}
