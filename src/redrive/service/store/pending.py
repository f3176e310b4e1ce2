"""Reading pending retries and making one due now, for operators.

First due first when browsing; a filter comes in as a :class:`.searches.PendingSearch`.
Retries come back as :class:`.read_models.Pending`; one of a key queue
(:mod:`.key_queues`) with its queue's facts: ``queue_head_id`` and ``queue_length``
(and, for one row or one queue's listing, ``queue_position``: 0 for the head).
"""

from __future__ import annotations

from typing import Any, Final, Literal

import psycopg
from psycopg.rows import dict_row

from redrive.service.store.key_queues import QUEUE_ORDER
from redrive.service.store.read_models import Pending
from redrive.service.store.rows import Row, decoded
from redrive.service.store.searches import PendingSearch, pending_where
from redrive.service.store.wakeups import notify_due

COLUMNS: Final = """
id, due_ms, destination, dest_partition, msg_key, msg_value, headers, attempt, group_id,
deadline_ms, original_topic, original_partition, original_offset, request_topic,
request_partition, request_offset, received_at, order_queue, held, delivered_ms
"""


# Each queue's head and length: one index probe each (redrive_pending_queue_ix).
_QUEUE_FACTS: Final = f"""
SELECT q,
       (SELECT id FROM redrive_pending h WHERE h.order_queue = q
        ORDER BY {QUEUE_ORDER} LIMIT 1),
       (SELECT count(*) FROM redrive_pending c WHERE c.order_queue = q)
FROM unnest(%s::bytea[]) AS q
"""

# How many rows of a queue come before a row (its place: 0 for the head).
_POSITION: Final = """
SELECT count(*) FROM redrive_pending
WHERE order_queue = %(queue)s
  AND (original_offset < %(offset)s OR (original_offset = %(offset)s
       AND (attempt > %(attempt)s OR (attempt = %(attempt)s AND id < %(id)s))))
"""

MadeDue = Literal["due", "gone", "behind", "delivered"]
"""What making a retry due did: made it due, found it gone, or refused because it is
held in its key's queue (behind its head, or delivered and awaiting its consumer)."""


def _select(conn: psycopg.Connection[Any], sql: str, params: Any) -> list[Row]:
    with conn.cursor(row_factory=dict_row) as cur:
        return _with_queues(conn, decoded(cur.execute(sql.encode(), params).fetchall()))


def _with_queues(conn: psycopg.Connection[Any], rows: list[Row]) -> list[Row]:
    """Rows with their key queues' head and length (None for rows that keep no order)."""
    queues = sorted({bytes(r["order_queue"]) for r in rows if r["order_queue"] is not None})
    facts: dict[bytes, tuple[int | None, int]] = {}
    if queues:
        for queue, head, length in conn.execute(_QUEUE_FACTS, (queues,)).fetchall():
            facts[bytes(queue)] = (head, int(length))
    for row in rows:
        if row["order_queue"] is not None:
            row["order_queue"] = bytes(row["order_queue"])
        row["queue_head_id"], row["queue_length"] = facts.get(row["order_queue"], (None, 0))
    return rows


def first_due(
    conn: psycopg.Connection[Any],
    search: PendingSearch,
    *,
    after: tuple[int, int] | None,
    limit: int,
) -> list[Pending]:
    """Up to `limit` retries matching `search`, first due first, after the (due_ms,
    id) sort key `after`."""
    where, params = pending_where(search)
    if after is not None:
        where += " AND (due_ms, id) > (%s, %s)"
        params += list(after)
    sql = f"SELECT {COLUMNS} FROM redrive_pending WHERE {where} ORDER BY due_ms, id LIMIT %s"
    return [Pending(**row) for row in _select(conn, sql, [*params, limit])]


def by_id(conn: psycopg.Connection[Any], pending_id: int) -> Pending | None:
    """The retry with its place in its key's queue (if it keeps its key's order)."""
    rows = _select(conn, f"SELECT {COLUMNS} FROM redrive_pending WHERE id = %s", (pending_id,))
    if not rows:
        return None
    row = rows[0]
    if row["order_queue"] is not None:
        row["queue_position"] = _position(conn, row)
    return Pending(**row)


def _position(conn: psycopg.Connection[Any], row: Row) -> int:
    params = {
        "queue": row["order_queue"],
        "offset": row["original_offset"],
        "attempt": row["attempt"],
        "id": row["id"],
    }
    found = conn.execute(_POSITION, params).fetchone()
    return int(found[0]) if found else 0


def queue(
    conn: psycopg.Connection[Any],
    order_queue: bytes,
    *,
    after: tuple[int, int, int] | None,
    limit: int,
) -> list[Pending]:
    """Up to `limit` rows of a key queue in its order (head first), after the
    (original_offset, attempt, id) sort key `after`; each with its place in the queue."""
    where = "order_queue = %s"
    params: list[Any] = [order_queue]
    if after is not None:
        # Spelled out, not a row comparison of negated attempts: a cursor's numbers
        # are any int64, which negation could overflow.
        where += (
            " AND (original_offset > %s OR (original_offset = %s"
            " AND (attempt < %s OR (attempt = %s AND id > %s))))"
        )
        params += [after[0], after[0], after[1], after[1], after[2]]
    sql = f"SELECT {COLUMNS} FROM redrive_pending WHERE {where} ORDER BY {QUEUE_ORDER} LIMIT %s"
    rows = _select(conn, sql, [*params, limit])
    # The rows of a page are consecutive: the first one's place gives the others'.
    first = 0 if after is None or not rows else _position(conn, rows[0])
    return [Pending(**row, queue_position=place) for place, row in enumerate(rows, start=first)]


def make_due(conn: psycopg.Connection[Any], pending_id: int, now_ms: int) -> MadeDue:
    """Make a retry due now, and wake the schedulers (NOTIFY), unless it is held in its
    key's queue: made due early, a row behind its head would still wait (only the
    head goes), and a delivered head is out already; saying so beats doing nothing.

    The row is locked first, so its state cannot change between the look and the write
    (a scheduler delivering it holds the same lock)."""
    with conn.transaction():
        found = conn.execute(
            "SELECT held, delivered_ms FROM redrive_pending WHERE id = %s FOR UPDATE",
            (pending_id,),
        ).fetchone()
        if found is None:
            return "gone"
        held, delivered_ms = found
        if held:
            return "delivered" if delivered_ms is not None else "behind"
        conn.execute(
            "UPDATE redrive_pending SET due_ms = LEAST(due_ms, %s) WHERE id = %s",
            (now_ms, pending_id),
        )
        notify_due(conn, now_ms)
    return "due"


def oldest_due_ms(conn: psycopg.Connection[Any]) -> int | None:
    """The earliest due time of a retry that may be delivered (not held behind its
    key's head), claimed by a scheduler or not; None if there is none. The claim
    index (due_ms, partial on NOT held) answers it without a scan."""
    row = conn.execute("SELECT min(due_ms) FROM redrive_pending WHERE NOT held").fetchone()
    return None if row is None or row[0] is None else int(row[0])


def by_destination(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """How many retries wait for each destination."""
    rows = conn.execute(
        "SELECT destination, count(*) FROM redrive_pending GROUP BY destination"
    ).fetchall()
    return {r[0]: int(r[1]) for r in rows}
