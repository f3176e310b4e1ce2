"""Intake's writes: a batch of pending retries and dead letters, stored in one go.

A batch is stored in one durable transaction, idempotently: a request read again
after a crash, or a failure its consumer wrote twice, is caught by a unique index
and skipped, so intake may always insert a batch again until it commits the batch's
offsets. Schedulers listening on :data:`NOTIFY_CHANNEL` learn the batch's earliest
due time when the transaction commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from redrive.records import DeadLetterRecord, PendingRetry, Release
from redrive.service.store import key_queues
from redrive.service.store.packed_headers import pack_headers
from redrive.service.store.rows import clean_text
from redrive.service.store.stats import COUNT_MINUTE, per_topic
from redrive.service.store.wakeups import notify_due

_PENDING_COLUMNS = (
    "due_ms, destination, dest_partition, msg_key, msg_value, headers, attempt, group_id, "
    "deadline_ms, original_topic, original_partition, original_offset, "
    "request_topic, request_partition, request_offset, order_queue, held"
)

# A batch is copied straight into place: COPY is the fastest way in, and psycopg
# writes its rows in C. Binary, because in text format every bytea value travels as
# hex (2 KiB for a 1 KiB message) that PostgreSQL then parses.
_COPY_PENDING = f"COPY redrive_pending ({_PENDING_COLUMNS}) FROM STDIN (FORMAT BINARY)"
_PENDING_TYPES = [  # the types of _PENDING_COLUMNS, in order
    "int8", "text", "int4", "bytea", "bytea", "bytea", "int4", "text", "int8",
    "text", "int4", "int8", "text", "int4", "int8", "bytea", "bool",
]  # fmt: skip
# When a row of the batch is already stored (a request read again after a crash, a
# failure its consumer wrote twice), that copy fails on a unique index; the batch then
# goes through a session-local staging table, from which one statement moves the rows
# that are new (twice PostgreSQL's work per row, so only then).
_STAGE_PENDING = """
CREATE TEMP TABLE IF NOT EXISTS redrive_intake_stage
    (LIKE redrive_pending INCLUDING DEFAULTS) ON COMMIT DELETE ROWS
"""
_COPY_STAGED = _COPY_PENDING.replace("redrive_pending", "redrive_intake_stage", 1)
_INSERT_STAGED = f"""
INSERT INTO redrive_pending ({_PENDING_COLUMNS})
SELECT {_PENDING_COLUMNS} FROM redrive_intake_stage
ON CONFLICT DO NOTHING
"""

_INSERT_DEAD = """
INSERT INTO redrive_dead_letters (
    topic, msg_key, msg_value, headers, attempt, group_id, original_topic,
    original_partition, original_offset, original_timestamp, error_type, error_message,
    error_trace, reason_code, reason, source, request_topic, request_partition, request_offset)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING
"""


def _pending_params(row: PendingRetry) -> tuple[Any, ...]:
    return (
        row.due_ms,
        row.destination,
        row.partition,
        row.key,
        row.value,
        pack_headers(row.headers),
        row.attempt,
        clean_text(row.group),
        row.deadline_ms,
        row.original_topic,
        row.original_partition,
        row.original_offset,
        row.request.topic,
        row.request.partition,
        row.request.offset,
        row.order_queue,
        # A retry of a key's queue waits until key_queues.advance lets it go.
        row.order is not None,
    )


def _dead_params(row: DeadLetterRecord) -> tuple[Any, ...]:
    req = row.request
    return (
        clean_text(row.topic),
        row.key,
        row.value,
        pack_headers(row.headers),
        row.attempt,
        clean_text(row.group),
        clean_text(row.original_topic),
        row.original_partition,
        row.original_offset,
        row.original_timestamp,
        clean_text(row.error_type),
        clean_text(row.error_message),
        clean_text(row.error_trace),
        row.reason_code.value,
        clean_text(row.reason),
        row.source,
        req.topic if req else None,
        req.partition if req else None,
        req.offset if req else None,
    )


def _copy(cur: psycopg.Cursor[Any], statement: str, rows: Sequence[tuple[Any, ...]]) -> None:
    with cur.copy(statement) as copy:
        copy.set_types(_PENDING_TYPES)
        for row in rows:
            copy.write_row(row)


def _insert_pending(conn: psycopg.Connection[Any], rows: Sequence[tuple[Any, ...]]) -> int:
    """Store pending rows (`_pending_params`) in the open transaction, skipping those
    already stored; returns how many were new."""
    try:
        with conn.transaction(), conn.cursor() as cur:  # a savepoint: undone on failure
            _copy(cur, _COPY_PENDING, rows)
        return len(rows)
    except psycopg.errors.UniqueViolation:
        pass
    with conn.cursor() as cur:
        cur.execute(_STAGE_PENDING)
        _copy(cur, _COPY_STAGED, rows)
        cur.execute(_INSERT_STAGED)
        return max(cur.rowcount, 0)


def insert_batch(
    conn: psycopg.Connection[Any],
    pending: Sequence[PendingRetry],
    dead: Sequence[DeadLetterRecord],
    releases: Sequence[Release] = (),
) -> int:
    """Store a batch in one transaction, counted; returns how many pending rows were new.
    Key queues the batch touched (ordered retries, releases) let their heads go."""
    inserted = 0
    with conn.transaction(), conn.cursor() as cur:
        if pending:
            inserted = _insert_pending(conn, [_pending_params(row) for row in pending])
            notify_due(conn, min(r.due_ms for r in pending))
        queues = [q for q in (r.order_queue for r in pending) if q is not None]
        key_queues.supersede(conn, queues)
        key_queues.release(conn, releases)
        key_queues.advance(conn, [*queues, *(r.queue for r in releases)])
        if dead:
            cur.executemany(_INSERT_DEAD, [_dead_params(r) for r in dead])
        counts = [("scheduled", t, n) for t, n in per_topic([r.destination for r in pending])]
        counts += [("dead_lettered", t, n) for t, n in per_topic([r.topic for r in dead])]
        if counts:
            cur.executemany(COUNT_MINUTE, counts)
    return inserted
