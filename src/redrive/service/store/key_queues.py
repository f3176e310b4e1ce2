"""Key queues: the retries of one key delivered one at a time, in the key's order.

A route with ``ordering="key"`` sends the retry service the retries of its records
(``redrive-order: key``) and the records that arrive behind them while they wait
(``redrive-order: behind``), and releases a queue's head once its consumer is done
with it (``redrive-order: release``). A queue is one group's, original topic's and
partition's, and record key's (:func:`redrive.records.order_queue`).

Invariant: of a queue's rows, only the head (the lowest original offset) may be
delivered, and only while it is not delivered already: every other row is ``held``.
A delivered head stays (``held``, with ``delivered_ms``) until its consumer releases
it or retries it again (a new attempt of the same record supersedes it); a head that
becomes a dead letter here (its deadline passed, an operator cancelled it) leaves its
queue too. :func:`advance` restores the invariant for the queues a write touched, in
the writer's transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import psycopg

from redrive.records import Release
from redrive.service.store.wakeups import notify_due

# A retry of a record replaces its earlier attempts (delivered, awaiting its outcome).
_SUPERSEDE = """
DELETE FROM redrive_pending old USING redrive_pending new
WHERE new.order_queue = ANY(%(queues)s) AND old.order_queue = new.order_queue
  AND old.original_offset = new.original_offset AND old.attempt < new.attempt
"""

# The consumer is done with a head: it leaves its queue.
_RELEASE = """
DELETE FROM redrive_pending
WHERE order_queue = %s AND original_offset = %s AND attempt <= %s
"""

QUEUE_ORDER: Final = "original_offset, attempt DESC, id"
"""A queue's order: the lowest original offset first (its newest attempt first); the
id only breaks ties nothing else breaks. Its head is the first."""

# Each queue's head may go, unless it is out already.
_ADVANCE = f"""
WITH heads AS (
    SELECT DISTINCT ON (order_queue) id, delivered_ms
    FROM redrive_pending
    WHERE order_queue = ANY(%(queues)s)
    ORDER BY order_queue, {QUEUE_ORDER}
)
UPDATE redrive_pending p SET held = false
FROM heads
WHERE p.id = heads.id AND heads.delivered_ms IS NULL AND p.held
RETURNING p.due_ms
"""

# Delivered heads wait for their consumer's release, held.
_DELIVERED = """
UPDATE redrive_pending SET held = true, delivered_ms = %s WHERE id = ANY(%s)
"""


def supersede(conn: psycopg.Connection[Any], queues: Sequence[bytes]) -> None:
    """Drop the earlier attempts of records a new attempt of which was just stored."""
    if queues:
        conn.execute(_SUPERSEDE, {"queues": list(queues)})


def release(conn: psycopg.Connection[Any], releases: Sequence[Release]) -> None:
    """Take released heads out of their queues (a release read again finds nothing)."""
    if releases:
        with conn.cursor() as cur:
            cur.executemany(_RELEASE, [(r.queue, r.original_offset, r.attempt) for r in releases])


def advance(conn: psycopg.Connection[Any], queues: Iterable[bytes]) -> int:
    """Let each queue's head go when nothing of the queue is out, and wake the
    schedulers for them; how many went."""
    wanted = sorted(set(queues))
    if not wanted:
        return 0
    went = conn.execute(_ADVANCE, {"queues": wanted}).fetchall()
    if went:
        # Due by now mostly (a head's time has come, or it never failed): at once.
        notify_due(conn, min(due for (due,) in went))
    return len(went)


def delivered(conn: psycopg.Connection[Any], ids: Sequence[int], now_ms: int) -> None:
    """Delivered heads: kept, held, until released."""
    if ids:
        conn.execute(_DELIVERED, (now_ms, list(ids)))
