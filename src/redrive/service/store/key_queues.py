"""Key queues: the retries of one key delivered in the key's order, in runs.

A route with ``ordering="key"`` sends the retry service the retries of its records
(``redrive-order: key``) and the records that arrive behind them while they wait
(``redrive-order: behind``), and releases each record of a queue once its consumer is
done with it (``redrive-order: release``). A queue is one group's, original topic's and
partition's, and record key's (:func:`redrive.records.order_queue`).

A queue is delivered in runs: its head, once due, with the records waiting behind it
(at most :data:`RUN_MOST`), claimed together by one scheduler and produced in the
queue's order, each marked with the run (``redrive-run``: the head's row id). A record
of a run that fails again comes back as a new attempt; its consumer drops the rest of
that run (:mod:`redrive.consumer.key_order_service`), and here they wait again behind
the new attempt (:func:`supersede`), delivered in its run.

Invariant: the delivered rows of a queue are a prefix of it (no row waits before a
delivered one, but for a retry stored just now, whose later delivered rows are held
again in the same transaction). Only the first row not delivered may be claimed, and
only when nothing of its queue is out; every other row is ``held``. A delivered row
stays (``held``, with ``delivered_ms``) until its consumer releases it or retries it
(a new attempt of the same record supersedes it); a row that becomes a dead letter
here (its deadline passed, an operator cancelled it) leaves its queue too.
:func:`advance` lets the next run go once the delivered prefix is gone, in the
writer's transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import psycopg

from redrive.records import Release
from redrive.service.store.wakeups import notify_due

# A retry of a record replaces its earlier attempts (delivered, awaiting its outcome).
_SUPERSEDE = """
DELETE FROM redrive_pending old
USING unnest(%(queues)s::bytea[], %(offsets)s::bigint[], %(attempts)s::int[])
    AS new(queue, original_offset, attempt)
WHERE old.order_queue = new.queue AND old.original_offset = new.original_offset
  AND old.attempt < new.attempt
"""

# A new attempt of a record of a run: the records delivered after it in its queue, which
# its consumer drops, wait again behind it.
_HELD_AGAIN = """
UPDATE redrive_pending p SET delivered_ms = NULL
FROM unnest(%(queues)s::bytea[], %(offsets)s::bigint[]) AS r(queue, original_offset)
WHERE p.order_queue = r.queue AND p.original_offset > r.original_offset
  AND p.delivered_ms IS NOT NULL
"""

# The consumer is done with records of queues: they leave them (one statement for
# all the releases an intake batch read).
_RELEASE = """
DELETE FROM redrive_pending p
USING unnest(%(queues)s::bytea[], %(offsets)s::bigint[], %(attempts)s::int[])
    AS r(queue, original_offset, attempt)
WHERE p.order_queue = r.queue AND p.original_offset = r.original_offset
  AND p.attempt <= r.attempt
"""

QUEUE_ORDER: Final = "original_offset, attempt DESC, id"
"""A queue's order: the lowest original offset first (its newest attempt first); the
id only breaks ties nothing else breaks. Its head is the first."""

RUN_MOST: Final = 32
"""Records of one queue delivered in one run at most (its head included); the rest go
in the next run, once this one is released. Not more: a record of a run failing again
sends the rest of the run back, to be delivered again, so a long run would be mostly
delivered for nothing where records fail often (with 10% failing, a run of 32 has its
first failure by the 10th record on average)."""

RunRow = tuple[Any, ...]
"""A row of a run as :data:`RUN_COLUMNS` lists it."""

_DELIVERED_COLUMNS: Final = (
    "id", "due_ms", "destination", "dest_partition", "msg_key", "msg_value", "headers",
    "deadline_ms", "order_queue",
)  # fmt: skip
RUN_COLUMNS: Final = ", ".join(_DELIVERED_COLUMNS)
"""What a scheduler reads of a row it delivers."""

# The records waiting behind heads just claimed, each queue's in its order, locked with
# them: no other scheduler claims a held row, so each run is one claimer's.
_BEHIND_HEADS = f"""
SELECT h.id, {", ".join("r." + column for column in _DELIVERED_COLUMNS)}
FROM unnest(%(heads)s::bigint[], %(queues)s::bytea[]) WITH ORDINALITY AS h(id, queue, n)
CROSS JOIN LATERAL (
    SELECT {RUN_COLUMNS}, original_offset, attempt
    FROM redrive_pending
    WHERE order_queue = h.queue AND held AND delivered_ms IS NULL
    ORDER BY {QUEUE_ORDER}
    LIMIT %(most)s
    FOR UPDATE
) r
ORDER BY h.n, r.original_offset, r.attempt DESC, r.id
LIMIT %(room)s
"""

# Each queue's head may go, unless it is out already (one index probe per queue).
_ADVANCE = f"""
WITH heads AS (
    SELECT h.id, h.delivered_ms
    FROM unnest(%(queues)s::bytea[]) AS q(queue)
    CROSS JOIN LATERAL (
        SELECT id, delivered_ms FROM redrive_pending
        WHERE order_queue = q.queue
        ORDER BY {QUEUE_ORDER}
        LIMIT 1
    ) h
)
UPDATE redrive_pending p SET held = false
FROM heads
WHERE p.id = heads.id AND heads.delivered_ms IS NULL AND p.held
RETURNING p.due_ms
"""

# Delivered rows wait for their consumer's release, held.
_DELIVERED = """
UPDATE redrive_pending SET held = true, delivered_ms = %s WHERE id = ANY(%s)
RETURNING order_queue
"""

# But not a row behind one of its queue that waits (its run acknowledged out of order,
# or a new attempt stored while the run was out, its consumer dropping the rest of the
# run): it waits too, delivered in that one's run. Each queue's scan stops at its first
# row waiting, right after its delivered prefix.
_PREFIX_ONLY = """
UPDATE redrive_pending p SET delivered_ms = NULL
FROM unnest(%s::bytea[]) AS q(queue)
CROSS JOIN LATERAL (
    SELECT e.original_offset AS first FROM redrive_pending e
    WHERE e.order_queue = q.queue AND e.delivered_ms IS NULL
    ORDER BY e.original_offset LIMIT 1
) w
WHERE p.order_queue = q.queue AND p.original_offset > w.first AND p.delivered_ms IS NOT NULL
"""


Retried = tuple[bytes, int, int]
"""A record of a key queue stored as its next attempt: (queue, original offset, attempt)."""


def supersede(conn: psycopg.Connection[Any], retried: Sequence[Retried]) -> None:
    """New attempts of records of queues were stored: their earlier attempts leave, and
    what was delivered after each in its queue waits again behind it (its consumer
    dropped it)."""
    if retried:
        queues, offsets, attempts = (list(column) for column in zip(*retried, strict=True))
        conn.execute(_SUPERSEDE, {"queues": queues, "offsets": offsets, "attempts": attempts})
        conn.execute(_HELD_AGAIN, {"queues": queues, "offsets": offsets})


def behind_heads(
    conn: psycopg.Connection[Any], heads: Sequence[tuple[int, bytes]], now_ms: int, room: int
) -> tuple[dict[int, list[RunRow]], int]:
    """The rest of each claimed head's run (head row id, queue), in the heads' order: the
    rows waiting behind it, in its queue's order, locked, up to the first one not due (a
    record behind may not overtake it); at most ``room`` rows in all. With how many of
    the heads it went through: the runs of those after are not known (no room left),
    so those heads wait for the next claim rather than go alone."""
    if not heads:
        return {}, 0
    ids, queues = zip(*heads, strict=True)
    rows = conn.execute(
        _BEHIND_HEADS,
        {"heads": list(ids), "queues": list(queues), "most": RUN_MOST - 1, "room": room},
        binary=True,
    ).fetchall()
    runs: dict[int, list[RunRow]] = {}
    cut: set[int] = set()
    for head, *row in rows:
        if head in cut:
            continue
        if row[1] > now_ms:
            cut.add(head)
            continue
        runs.setdefault(head, []).append(tuple(row))
    if len(rows) < room:
        return runs, len(heads)
    last = rows[-1][0]  # its run may be cut short: a prefix of it, the rest next time
    return runs, ids.index(last) + 1


def release(conn: psycopg.Connection[Any], releases: Sequence[Release]) -> None:
    """Take released heads out of their queues (a release read again finds nothing)."""
    if releases:
        conn.execute(
            _RELEASE,
            {
                "queues": [r.queue for r in releases],
                "offsets": [r.original_offset for r in releases],
                "attempts": [r.attempt for r in releases],
            },
        )


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
    """Delivered rows of key queues: kept, held, until released; those behind a row of
    their queue that waits, waiting again."""
    if ids:
        queues = {queue for (queue,) in conn.execute(_DELIVERED, (now_ms, list(ids)))}
        conn.execute(_PREFIX_ONLY, (sorted(queues),))
