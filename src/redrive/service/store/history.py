"""Delivered retries kept as history, and a record's steps across the three tables.

A delivered retry is copied to `redrive_history` in the scheduler's settling
transaction, by the statement that deletes its pending row (or, for a row kept held at
the head of its key's queue, just before it is marked delivered): a row in history
means the broker acknowledged that retry. Retention is enforced by :func:`prune`, a
bounded batch at a time, so that no delete holds locks for long or competes with the
scheduler for minutes.

A record (group, original topic, partition, offset) is found by its key or by its
coordinates in pending retries, history and dead letters alike; :mod:`redrive.service.stories`
tells its story from those steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import psycopg
from psycopg.rows import dict_row

from redrive.service.store.read_models import Step
from redrive.service.store.rows import decoded

COLUMNS: Final = (
    "id, destination, msg_key, headers, attempt, group_id, original_topic, "
    "original_partition, original_offset, due_ms, received_at"
)
"""The columns a history row copies from its pending row, by the same names."""

_RECORD: Final = f"""
INSERT INTO redrive_history ({COLUMNS})
SELECT {COLUMNS} FROM redrive_pending WHERE id = ANY(%s)
ON CONFLICT (id) DO NOTHING
"""

# No ORDER BY: the BRIN index yields old block ranges, and sorting every candidate
# of a large backlog for each batch would cost more than it orders.
_PRUNE: Final = """
DELETE FROM redrive_history WHERE id IN (
    SELECT id FROM redrive_history
    WHERE delivered_at < now() - make_interval(secs => %s)
    LIMIT %s)
"""

MAX_STEPS: Final = 500
"""The most steps one search returns (a key can have many records)."""

# One shape for the three tables: what a step of a story needs.
_STEPS: Final = """
SELECT * FROM (
  SELECT 'delivered' AS kind, id, destination AS topic, msg_key, headers, attempt, group_id,
         original_topic, original_partition, original_offset, due_ms, received_at,
         delivered_at AS ended_at, NULL::text AS reason_code, NULL::text AS reason,
         NULL::text AS error_type, NULL::text AS error_message
  FROM redrive_history WHERE {history}
  UNION ALL
  SELECT CASE WHEN delivered_ms IS NULL THEN 'pending' ELSE 'delivered' END, id, destination,
         msg_key, headers, attempt, group_id, original_topic, original_partition,
         original_offset, due_ms, received_at, to_timestamp(delivered_ms / 1000.0),
         NULL, NULL, NULL, NULL
  FROM redrive_pending p WHERE {pending}
    AND NOT EXISTS (SELECT 1 FROM redrive_history h WHERE h.id = p.id)
  UNION ALL
  SELECT 'dead', id, topic, msg_key, headers, attempt, group_id, original_topic,
         original_partition, original_offset, NULL, NULL, dead_at, reason_code, reason,
         error_type, error_message
  FROM redrive_dead_letters WHERE {dead}
) steps
ORDER BY group_id NULLS FIRST, original_topic, original_partition, original_offset,
         attempt, received_at NULLS LAST, id
LIMIT %s
"""


def record(conn: psycopg.Connection[Any], ids: Sequence[int]) -> None:
    """Copy these pending rows to history: the broker acknowledged their delivery."""
    if ids:
        conn.execute(_RECORD, (list(ids),))


def prune(conn: psycopg.Connection[Any], *, older_than_s: float, limit: int) -> int:
    """Delete up to `limit` of the oldest entries delivered over `older_than_s` ago."""
    return conn.execute(_PRUNE, (older_than_s, limit)).rowcount


def steps(
    conn: psycopg.Connection[Any],
    *,
    key: bytes | None = None,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
    limit: int = MAX_STEPS,
) -> list[Step]:
    """Every step of the records with this key, or at these original coordinates
    (a topic, and optionally its partition and offset), in story order."""
    conditions: list[str] = []
    params: list[Any] = []
    if key is not None:
        # Found through the hash indexes on msg_key (migration 009), any length of key.
        conditions.append("msg_key = %s")
        params.append(key)
    for column, value in (
        ("original_topic", topic),
        ("original_partition", partition),
        ("original_offset", offset),
    ):
        if value is not None:
            conditions.append(f"{column} = %s")
            params.append(value)
    if not conditions:
        raise ValueError("give a key or an original topic")
    where = " AND ".join(conditions)
    sql = _STEPS.format(history=where, pending=where, dead=where)
    with conn.cursor(row_factory=dict_row) as cur:
        rows = decoded(cur.execute(sql.encode(), [*params * 3, limit]).fetchall())
    return [Step(**row) for row in rows]


def count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM redrive_history").fetchone()
    return int(row[0]) if row else 0
