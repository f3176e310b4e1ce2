"""Reading and deleting dead letters, for operators (the API, the UI, replays).

Newest first when browsing, oldest first when listing ids to replay; a filter comes
in as a :class:`.searches.DeadLetterSearch`. Letters come back as
:class:`.read_models.DeadLetter`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import psycopg
from psycopg.rows import dict_row

from redrive.service.store.packed_headers import unpack_headers
from redrive.service.store.read_models import DeadLetter
from redrive.service.store.rows import Row, decoded
from redrive.service.store.searches import DeadLetterSearch, dead_letters_where

COLUMNS: Final = """
id, topic, msg_key, msg_value, headers, attempt, group_id, original_topic,
original_partition, original_offset, original_timestamp, error_type, error_message,
error_trace, reason_code, reason, source, request_topic, request_partition,
request_offset, dead_at, fingerprint, error_group, replays, replay_of, quarantined_at,
record_missing
"""


def _select(conn: psycopg.Connection[Any], sql: str, params: Sequence[Any]) -> list[DeadLetter]:
    with conn.cursor(row_factory=dict_row) as cur:
        return [DeadLetter(**row) for row in decoded(cur.execute(sql.encode(), params).fetchall())]


def newest(
    conn: psycopg.Connection[Any], search: DeadLetterSearch, *, before_id: int | None, limit: int
) -> list[DeadLetter]:
    """Up to `limit` letters matching `search`, newest first, older than `before_id`."""
    where, params = dead_letters_where(search)
    if before_id is not None:
        where += " AND id < %s"
        params.append(before_id)
    sql = f"SELECT {COLUMNS} FROM redrive_dead_letters WHERE {where} ORDER BY id DESC LIMIT %s"
    return _select(conn, sql, [*params, limit])


def by_ids(conn: psycopg.Connection[Any], ids: Sequence[int]) -> list[DeadLetter]:
    """The letters of these ids that exist, by id."""
    sql = f"SELECT {COLUMNS} FROM redrive_dead_letters WHERE id = ANY(%s) ORDER BY id"
    return _select(conn, sql, (list(ids),))


def ids(conn: psycopg.Connection[Any], search: DeadLetterSearch, *, limit: int) -> list[int]:
    """Ids `search` matches, oldest first (the order a replay sends them in)."""
    where, params = dead_letters_where(search)
    sql = f"SELECT id FROM redrive_dead_letters WHERE {where} ORDER BY id LIMIT %s"
    return [r[0] for r in conn.execute(sql.encode(), [*params, limit]).fetchall()]


def count(conn: psycopg.Connection[Any], search: DeadLetterSearch) -> int:
    where, params = dead_letters_where(search)
    sql = f"SELECT count(*) FROM redrive_dead_letters WHERE {where}"
    row = conn.execute(sql.encode(), params).fetchone()
    return int(row[0]) if row else 0


def topic_counts(conn: psycopg.Connection[Any], search: DeadLetterSearch) -> dict[str, int]:
    """How many letters `search` matches on each topic ("" for letters without one)."""
    where, params = dead_letters_where(search)
    sql = f"SELECT coalesce(topic, ''), count(*) FROM redrive_dead_letters WHERE {where} GROUP BY 1"
    return {str(t): int(n) for t, n in conn.execute(sql.encode(), params).fetchall()}


def delete(conn: psycopg.Connection[Any], ids: Sequence[int]) -> list[int]:
    """Delete; returns the ids that existed, in order."""
    rows = conn.execute(
        "DELETE FROM redrive_dead_letters WHERE id = ANY(%s) RETURNING id", (list(ids),)
    ).fetchall()
    return sorted(r[0] for r in rows)


def latest(conn: psycopg.Connection[Any], *, limit: int) -> list[Row]:
    """The newest letters, every column (for checks and tools)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT * FROM redrive_dead_letters ORDER BY dead_at DESC, id DESC LIMIT %s",
            (limit,),
        ).fetchall()
    for row in rows:
        row["headers"] = unpack_headers(row["headers"])
    return rows
