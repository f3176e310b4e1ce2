"""The scheduler's side: claiming due rows, and settling what became of them.

Schedulers claim due rows in due order with row locks (`FOR UPDATE SKIP LOCKED`) in
a transaction held open while the rows are produced, so that several instances share
the work and a crashed instance's rows come back the moment its connection drops.
Row locks, not a lease column: locking writes no new row version and touches no
index, where a lease UPDATE rewrote every row and all its index entries. What became
of the rows (:class:`Settlement`) is recorded in that same transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import psycopg
import structlog

from redrive.clock import now_ms as clock_ms
from redrive.headers import DESTINATION, PARTITION, RUN, Header
from redrive.reasons import DeadLetterReason
from redrive.service.store import history, key_queues
from redrive.service.store.error_groups import grouping_of, record_groups
from redrive.service.store.packed_headers import unpack_headers
from redrive.service.store.rows import id_array
from redrive.service.store.stats import COUNT_MINUTE, per_topic

log = structlog.get_logger("redrive.store")

_CLAIM_DUE = f"""
SELECT {key_queues.RUN_COLUMNS}
FROM redrive_pending
WHERE due_ms <= %(now)s AND NOT held
ORDER BY due_ms, id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

# The first row free for the taking (rows another scheduler holds are skipped).
_NEXT_DUE = """
SELECT due_ms FROM redrive_pending WHERE NOT held ORDER BY due_ms, id LIMIT 1
FOR KEY SHARE SKIP LOCKED
"""

_RELEASE = """
UPDATE redrive_pending SET due_ms = GREATEST(due_ms, %s) WHERE id = ANY(%s)
"""

# Move rows that can never be delivered to the dead letters, in one transaction.
_PENDING_TO_DEAD = """
WITH moved AS (DELETE FROM redrive_pending WHERE id = %(id)s RETURNING *)
INSERT INTO redrive_dead_letters (
    topic, msg_key, msg_value, headers, attempt, group_id, original_topic,
    original_partition, original_offset, reason_code, reason, source,
    request_topic, request_partition, request_offset, fingerprint, error_group)
SELECT destination, msg_key, msg_value, headers, attempt, group_id, original_topic,
       original_partition, original_offset, %(code)s, %(reason)s, 'scheduler',
       request_topic, request_partition, request_offset, %(group)s, %(group)s
FROM moved
ON CONFLICT DO NOTHING
"""


def _delete_delivered(on_conflict: str) -> str:
    """Forget delivered rows, copy them to the history if it is kept, and count them:
    one statement, so each row is found once (a copy before the delete found every
    row twice)."""
    return f"""
WITH gone AS (
    DELETE FROM redrive_pending WHERE id = ANY(%(ids)s::bigint[]) RETURNING {history.COLUMNS}
), kept AS (
    INSERT INTO redrive_history ({history.COLUMNS})
    SELECT {history.COLUMNS} FROM gone WHERE %(keep_history)s
    {on_conflict}
)
INSERT INTO redrive_stats_minute (minute, kind, topic, count)
SELECT date_trunc('minute', now()), 'published', destination, count(*) FROM gone
GROUP BY destination
ON CONFLICT (minute, kind, topic)
DO UPDATE SET count = redrive_stats_minute.count + EXCLUDED.count
"""


# No path copies a delivered row to the history twice: a row leaves pending as it is
# copied, and the heads of key queues, copied while they stay (history.record), are
# never settled this way. So the copy goes without ON CONFLICT, which cost PostgreSQL
# about 1 us per delivered row (benchmark 2, issue 20). Should a row be there all the
# same, the copy fails on the history's key, and the batch is settled again keeping
# the first copy: a failed settlement would deliver the batch again, forever.
_DELIVERED_FIRST_COPY = _delete_delivered("")
_DELIVERED_KEEPING_COPIES = _delete_delivered("ON CONFLICT (id) DO NOTHING")


# Count delivered rows of key queues as published (they stay, held, until released).
_COUNT_KEPT = """
INSERT INTO redrive_stats_minute (minute, kind, topic, count)
SELECT date_trunc('minute', now()), 'published', destination, count(*)
FROM redrive_pending WHERE id = ANY(%s)
GROUP BY destination
ON CONFLICT (minute, kind, topic)
DO UPDATE SET count = redrive_stats_minute.count + EXCLUDED.count
"""


@dataclass(slots=True)  # not frozen: built once per request, on the hot path
class ClaimedRetry:
    """A due row a scheduler holds (locked), ready to be produced."""

    id: int
    due_ms: int
    destination: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    deadline_ms: int | None
    order_queue: bytes | None = None
    """The key queue it is of (:mod:`.key_queues`), if it keeps its key's order."""
    as_stored: list[Header] | None = None
    """Its headers as stored, when the claim changed its redrive headers (a run's mark;
    a record of a run going where its head goes): the request's signature was made over
    those, and must be made again over ``headers`` for its reader to verify it."""


DeadRow = tuple[int, DeadLetterReason, str]
"""A pending row that can never be delivered: (id, reason code, reason)."""


@dataclass(frozen=True, slots=True)
class Settlement:
    """What became of claimed rows: `delivered` ones are forgotten (`kept` ones, rows
    of key queues, stay until their consumer releases them), `dead` ones (id, reason
    code, reason) move to the dead letters, and `retry` ones (a delivery failed for a
    passing reason) are due again at `retry_at_ms`."""

    delivered: Sequence[int] = ()
    kept: Sequence[int] = ()
    dead: Sequence[DeadRow] = ()
    retry: Sequence[int] = ()
    retry_at_ms: int = 0


RUNS_PER_CLAIM: Final = 4
"""A claim's records behind its heads, at most, as a multiple of its limit: a run cut
short goes on in the next one."""


def claim_due(conn: psycopg.Connection[Any], *, now_ms: int, limit: int) -> list[ClaimedRetry]:
    """Lock up to `limit` due rows nobody holds, in due order, in the open transaction;
    each head of a key queue with the rest of its run right after it, marked with the
    run (``redrive-run``), up to `limit` times :data:`RUNS_PER_CLAIM` rows behind heads
    in all. Heads past that are left for the next claim (locked until this one ends)."""
    rows = conn.execute(_CLAIM_DUE, {"now": now_ms, "limit": limit}, binary=True).fetchall()
    heads = [(r[0], r[8]) for r in rows if r[8] is not None]
    if not heads:
        return [_claimed(r) for r in rows]
    behind, reached = key_queues.behind_heads(conn, heads, now_ms, limit * RUNS_PER_CLAIM)
    left = {head for head, _ in heads[reached:]}
    claimed: list[ClaimedRetry] = []
    for row in rows:
        if row[8] is None:
            claimed.append(_claimed(row))
        elif row[0] not in left:
            run: list[Header] = [(RUN, b"%d" % row[0])]
            head = _claimed(row, run)
            claimed.append(head)
            # A run goes where its head goes, one partition in order: a record put
            # behind after its route moved its retries to another topic still comes
            # back after its head.
            claimed += [_claimed(r, run, head) for r in behind.get(row[0], [])]
    return claimed


def _claimed(
    row: key_queues.RunRow, run: list[Header] | None = None, head: ClaimedRetry | None = None
) -> ClaimedRetry:
    headers = unpack_headers(row[6])
    if run is None:
        return ClaimedRetry(row[0], row[1], row[2], row[3], row[4], row[5], headers, row[7], row[8])
    to, partition = (row[2], row[3]) if head is None else (head.destination, head.partition)
    delivered = headers + run
    if (to, partition) != (row[2], row[3]):
        # Its redrive headers name where it goes, as its reader checks a return's do.
        delivered = _delivered_to(delivered, to, partition)
    return ClaimedRetry(
        row[0], row[1], to, partition, row[4], row[5], delivered, row[7], row[8], headers
    )


def _delivered_to(headers: list[Header], topic: str, partition: int | None) -> list[Header]:
    """``headers`` naming ``topic`` (and ``partition``, or none) as the destination."""
    moved: list[Header] = []
    for name, value in headers:
        if name == DESTINATION:
            moved.append((name, topic.encode()))
        elif name != PARTITION:
            moved.append((name, value))
    if partition is not None:
        moved.append((PARTITION, b"%d" % partition))
    return moved


def next_due_ms(conn: psycopg.Connection[Any]) -> int | None:
    """The earliest due time of a row no scheduler holds, or None if there is none."""
    row = conn.execute(_NEXT_DUE).fetchone()
    return None if row is None else int(row[0])


def to_dead_letters(conn: psycopg.Connection[Any], failures: Sequence[DeadRow]) -> None:
    """Move pending rows to the dead letters, counted (rows already gone are skipped);
    the next of a key queue whose row it was may go."""
    with conn.cursor() as cur:
        moved = cur.execute(
            "SELECT destination, order_queue FROM redrive_pending WHERE id = ANY(%s)",
            ([i for i, _, _ in failures],),
        ).fetchall()
        # Without an error (the broker's refusal is the reason): grouped by the reason.
        groups = [grouping_of(None, None, None, code.value, why) for _, code, why in failures]
        record_groups(cur, groups)
        cur.executemany(
            _PENDING_TO_DEAD,
            [
                {"id": i, "code": code.value, "reason": reason, "group": g.fingerprint}
                for (i, code, reason), g in zip(failures, groups, strict=True)
            ],
        )
        for topic, count in per_topic([t[0] for t in moved]):
            cur.execute(COUNT_MINUTE, ("dead_lettered", topic, count))
    key_queues.advance(conn, [q for _, q in moved if q is not None])


def settle(
    conn: psycopg.Connection[Any], settlement: Settlement, *, keep_history: bool = False
) -> None:
    """Record a settlement in the open transaction; with `keep_history`, what was
    delivered is copied to the history (:mod:`.history`) as it leaves pending."""
    if settlement.delivered:
        delivered = {"ids": id_array(settlement.delivered), "keep_history": keep_history}
        try:
            with conn.transaction():  # a savepoint: undone on failure
                conn.execute(_DELIVERED_FIRST_COPY, delivered)
        except psycopg.errors.UniqueViolation:
            log.warning(
                "delivered retries were already in the history; their first copy is kept",
                ids=list(settlement.delivered)[:10],
                rows=len(settlement.delivered),
            )
            conn.execute(_DELIVERED_KEEPING_COPIES, delivered)
    if settlement.dead:
        # First: a row of a run that became a dead letter leaves its queue before the
        # rest of the run counts as delivered (a dead letter is no gap in the run).
        to_dead_letters(conn, settlement.dead)
    if settlement.kept:
        if keep_history:  # rows of key queues stay pending: copied, not moved
            history.record(conn, settlement.kept)
        key_queues.delivered(conn, settlement.kept, clock_ms())
        conn.execute(_COUNT_KEPT, (list(settlement.kept),))
    if settlement.retry:
        conn.execute(_RELEASE, (settlement.retry_at_ms, list(settlement.retry)))


class Claim:
    """Rows one scheduler holds: locked in its open transaction until the claim ends."""

    def __init__(
        self, conn: psycopg.Connection[Any], rows: list[ClaimedRetry], *, keep_history: bool
    ) -> None:
        self._conn = conn
        self.rows = rows
        self._keep_history = keep_history

    def settle(self, settlement: Settlement) -> None:
        """Record the outcome; it takes effect when the claim's transaction commits."""
        settle(self._conn, settlement, keep_history=self._keep_history)
