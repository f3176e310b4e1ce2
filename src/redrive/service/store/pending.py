"""Reading pending retries and making one due now, for operators.

First due first when browsing; a filter comes in as a :class:`Condition`. Rows come
back decoded (:func:`rows.decoded`).
"""

from __future__ import annotations

from typing import Any, Final

import psycopg
from psycopg.rows import dict_row

from redrive.service.store.intake_writes import NOTIFY_CHANNEL
from redrive.service.store.rows import Condition, Row, decoded

COLUMNS: Final = """
id, due_ms, destination, dest_partition, msg_key, msg_value, headers, attempt, group_id,
deadline_ms, original_topic, original_partition, original_offset, request_topic,
request_partition, request_offset, received_at
"""


def first_due(
    conn: psycopg.Connection[Any],
    condition: Condition,
    *,
    after: tuple[int, int] | None,
    limit: int,
) -> list[Row]:
    """Up to `limit` retries matching `condition`, first due first, after the (due_ms,
    id) sort key `after`."""
    where, params = condition.where()
    if after is not None:
        where += " AND (due_ms, id) > (%s, %s)"
        params += list(after)
    sql = f"SELECT {COLUMNS} FROM redrive_pending WHERE {where} ORDER BY due_ms, id LIMIT %s"
    with conn.cursor(row_factory=dict_row) as cur:
        return decoded(cur.execute(sql.encode(), [*params, limit]).fetchall())


def by_id(conn: psycopg.Connection[Any], pending_id: int) -> Row | None:
    sql = f"SELECT {COLUMNS} FROM redrive_pending WHERE id = %s"
    with conn.cursor(row_factory=dict_row) as cur:
        rows = decoded(cur.execute(sql.encode(), (pending_id,)).fetchall())
    return rows[0] if rows else None


def make_due(conn: psycopg.Connection[Any], pending_id: int, now_ms: int) -> bool:
    """Make a retry due now, and wake the schedulers (NOTIFY); False if it is gone."""
    with conn.transaction():
        updated = conn.execute(
            "UPDATE redrive_pending SET due_ms = LEAST(due_ms, %s) WHERE id = %s",
            (now_ms, pending_id),
        ).rowcount
        if updated:
            conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, str(now_ms)))
    return bool(updated)


def by_destination(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """How many retries wait for each destination."""
    rows = conn.execute(
        "SELECT destination, count(*) FROM redrive_pending GROUP BY destination"
    ).fetchall()
    return {r[0]: int(r[1]) for r in rows}
