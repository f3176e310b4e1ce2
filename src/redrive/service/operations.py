"""What operators see and do: dead letters, pending retries, stats, the audit log.

The engine's own SQL (intake, scheduler) is in store.py; this module holds the
operator side, on the same connection pool. Every mutating method here is called by
the API after the caller's role was checked, and the API writes the audit entry.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from psycopg.rows import dict_row

from redrive.service.filters import (
    DeadLetterFilter,
    PendingFilter,
    decode_cursor,
    encode_cursor,
)
from redrive.service.store import Store, headers_from_json

Row = dict[str, Any]

_DEAD_COLUMNS = """
id, topic, msg_key, msg_value, headers, attempt, group_id, original_topic,
original_partition, original_offset, original_timestamp, error_type, error_message,
error_trace, reason_code, reason, source, request_topic, request_partition,
request_offset, dead_at
"""

_PENDING_COLUMNS = """
id, due_ms, destination, dest_partition, msg_key, msg_value, headers, attempt, group_id,
deadline_ms, original_topic, original_partition, original_offset, request_topic,
request_partition, request_offset, received_at
"""


def _rows(rows: list[Row]) -> list[Row]:
    for row in rows:
        row["headers"] = headers_from_json(row["headers"])
        for name in ("msg_key", "msg_value"):
            if row.get(name) is not None:
                row[name] = bytes(row[name])
    return rows


def _page(rows: list[Row], limit: int, *sort_key: str) -> tuple[list[Row], str | None]:
    """A page from `limit + 1` fetched rows: the extra row only says a next page exists;
    the cursor is the sort key of the page's last row."""
    page = rows[:limit]
    if len(rows) <= limit or not page:
        return page, None
    return page, encode_cursor(*(page[-1][column] for column in sort_key))


class Operations:
    def __init__(self, store: Store) -> None:
        self.store = store

    # ---------------------------------------------------------------- dead letters

    def dead_letters(
        self, flt: DeadLetterFilter, *, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[Row], str | None]:
        """Newest first; returns a page and the cursor of the next one (None at the end)."""
        where, params = flt.where()
        if cursor:
            (last_id,) = decode_cursor(cursor, 1)
            where += " AND id < %s"
            params.append(last_id)
        sql = (
            f"SELECT {_DEAD_COLUMNS} FROM redrive_dead_letters WHERE {where} "
            "ORDER BY id DESC LIMIT %s"
        )
        with self.store._conn() as conn, conn.cursor(row_factory=dict_row) as cur:
            rows = _rows(cur.execute(sql.encode(), [*params, limit + 1]).fetchall())
        return _page(rows, limit, "id")

    def dead_letter(self, letter_id: int) -> Row | None:
        with self.store._conn() as conn, conn.cursor(row_factory=dict_row) as cur:
            sql = f"SELECT {_DEAD_COLUMNS} FROM redrive_dead_letters WHERE id = %s"
            rows = _rows(cur.execute(sql.encode(), (letter_id,)).fetchall())
        return rows[0] if rows else None

    def dead_letters_by_id(self, ids: Sequence[int]) -> list[Row]:
        with self.store._conn() as conn, conn.cursor(row_factory=dict_row) as cur:
            sql = f"SELECT {_DEAD_COLUMNS} FROM redrive_dead_letters WHERE id = ANY(%s) ORDER BY id"
            return _rows(cur.execute(sql.encode(), (list(ids),)).fetchall())

    def dead_letter_ids(self, flt: DeadLetterFilter, *, limit: int) -> list[int]:
        """Ids a filter matches, oldest first (the order a replay sends them in)."""
        where, params = flt.where()
        sql = f"SELECT id FROM redrive_dead_letters WHERE {where} ORDER BY id LIMIT %s"
        with self.store._conn() as conn:
            return [r[0] for r in conn.execute(sql.encode(), [*params, limit]).fetchall()]

    def count_dead_letters(self, flt: DeadLetterFilter) -> int:
        where, params = flt.where()
        with self.store._conn() as conn:
            row = conn.execute(
                f"SELECT count(*) FROM redrive_dead_letters WHERE {where}".encode(), params
            ).fetchone()
        return int(row[0]) if row else 0

    def delete_dead_letters(self, ids: Sequence[int]) -> list[int]:
        """Delete; returns the ids that existed."""
        with self.store._conn() as conn:
            rows = conn.execute(
                "DELETE FROM redrive_dead_letters WHERE id = ANY(%s) RETURNING id", (list(ids),)
            ).fetchall()
        return sorted(r[0] for r in rows)

    # ---------------------------------------------------------------- pending retries

    def pending(
        self, flt: PendingFilter, *, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[Row], str | None]:
        """First due first; a page and the next cursor."""
        where, params = flt.where()
        if cursor:
            due, last_id = decode_cursor(cursor, 2)
            where += " AND (due_ms, id) > (%s, %s)"
            params += [due, last_id]
        sql = (
            f"SELECT {_PENDING_COLUMNS} FROM redrive_pending WHERE {where} "
            "ORDER BY due_ms, id LIMIT %s"
        )
        with self.store._conn() as conn, conn.cursor(row_factory=dict_row) as cur:
            rows = _rows(cur.execute(sql.encode(), [*params, limit + 1]).fetchall())
        return _page(rows, limit, "due_ms", "id")

    def pending_one(self, pending_id: int) -> Row | None:
        with self.store._conn() as conn, conn.cursor(row_factory=dict_row) as cur:
            sql = f"SELECT {_PENDING_COLUMNS} FROM redrive_pending WHERE id = %s"
            rows = _rows(cur.execute(sql.encode(), (pending_id,)).fetchall())
        return rows[0] if rows else None

    def retry_now(self, pending_id: int, now_ms: int) -> bool:
        """Make a pending retry due now (the scheduler is woken through NOTIFY)."""
        with self.store._conn() as conn, conn.transaction():
            updated = conn.execute(
                "UPDATE redrive_pending SET due_ms = LEAST(due_ms, %s) WHERE id = %s",
                (now_ms, pending_id),
            ).rowcount
            if updated:
                conn.execute("SELECT pg_notify('redrive_pending', %s)", (str(now_ms),))
        return bool(updated)

    def cancel(self, pending_id: int, actor: str) -> bool:
        """Move a pending retry to the dead letters (reason: cancelled by an operator)."""
        before = self.pending_one(pending_id)
        if before is None:
            return False
        self.store.to_dead_letters([(pending_id, "cancelled", f"cancelled by operator {actor}")])
        return self.pending_one(pending_id) is None

    # ---------------------------------------------------------------- stats

    def stats(self) -> dict[str, Any]:
        with self.store._conn() as conn:

            def grouped(sql: str) -> list[dict[str, Any]]:
                return [{"key": r[0], "count": int(r[1])} for r in conn.execute(sql.encode())]

            return {
                "dead_letters": {
                    "total": conn.execute("SELECT count(*) FROM redrive_dead_letters").fetchone()[
                        0
                    ],  # type: ignore[index]
                    "by_topic": grouped(
                        "SELECT coalesce(topic, ''), count(*) FROM redrive_dead_letters "
                        "GROUP BY 1 ORDER BY 2 DESC LIMIT 50"
                    ),
                    "by_group": grouped(
                        "SELECT coalesce(group_id, ''), count(*) FROM redrive_dead_letters "
                        "GROUP BY 1 ORDER BY 2 DESC LIMIT 50"
                    ),
                    "by_error_type": grouped(
                        "SELECT coalesce(error_type, ''), count(*) FROM redrive_dead_letters "
                        "GROUP BY 1 ORDER BY 2 DESC LIMIT 50"
                    ),
                    "by_reason": grouped(
                        "SELECT reason_code, count(*) FROM redrive_dead_letters "
                        "GROUP BY 1 ORDER BY 2 DESC LIMIT 50"
                    ),
                },
                "pending": {
                    "total": conn.execute("SELECT count(*) FROM redrive_pending").fetchone()[0],  # type: ignore[index]
                    "by_destination": grouped(
                        "SELECT destination, count(*) FROM redrive_pending "
                        "GROUP BY 1 ORDER BY 2 DESC LIMIT 50"
                    ),
                },
            }

    def rates(self, minutes: int) -> dict[str, list[dict[str, Any]]]:
        """Per-minute counts of the last `minutes` minutes, by kind (all topics summed),
        with zero for quiet minutes, oldest first."""
        sql = """
        WITH span AS (
            SELECT generate_series(date_trunc('minute', now()) - (%s - 1) * interval '1 minute',
                                   date_trunc('minute', now()), interval '1 minute') AS minute)
        SELECT span.minute, kinds.kind, coalesce(sum(s.count), 0)
        FROM span CROSS JOIN (VALUES ('scheduled'), ('published'), ('dead_lettered')) kinds(kind)
        LEFT JOIN redrive_stats_minute s ON s.minute = span.minute AND s.kind = kinds.kind
        GROUP BY span.minute, kinds.kind ORDER BY span.minute
        """
        series: dict[str, list[dict[str, Any]]] = {
            "scheduled": [],
            "published": [],
            "dead_lettered": [],
        }
        with self.store._conn() as conn:
            for minute, kind, count in conn.execute(sql.encode(), (minutes,)):
                series[kind].append({"minute": minute.isoformat(), "count": int(count)})
        return series

    # ---------------------------------------------------------------- audit

    def audit(
        self,
        *,
        actor: str,
        role: str,
        action: str,
        ids: Sequence[int] = (),
        flt: DeadLetterFilter | PendingFilter | None = None,
        count: int = 0,
        detail: dict[str, Any] | None = None,
    ) -> None:
        with self.store._conn() as conn:
            conn.execute(
                "INSERT INTO redrive_audit (actor, role, action, ids, filter, count, detail)"
                " VALUES (%s, %s, %s, %s, %s::jsonb, %s, %s::jsonb)",
                (
                    actor,
                    role,
                    action,
                    list(ids),
                    None if flt is None else flt.model_dump_json(exclude_none=True),
                    count,
                    None if detail is None else json.dumps(detail),
                ),
            )

    def audit_log(
        self, *, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[Row], str | None]:
        where, params = "TRUE", []
        if cursor:
            (last_id,) = decode_cursor(cursor, 1)
            where, params = "id < %s", [last_id]
        with self.store._conn() as conn, conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(
                f"SELECT id, at, actor, role, action, ids, filter, count, detail "
                f"FROM redrive_audit WHERE {where} ORDER BY id DESC LIMIT %s".encode(),
                [*params, limit + 1],
            ).fetchall()
        return _page(rows, limit, "id")
