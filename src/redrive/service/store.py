"""The retry service's PostgreSQL store: pending retries and dead letters.

All SQL of the engine is here. Rows are written by intake (`insert_batch`), claimed
in due order by schedulers (`claim_due`: row locks taken with `FOR UPDATE SKIP LOCKED`
in a transaction held open while the rows are produced, so that several instances
share the work and a crashed instance's rows come back the moment its connection
drops), and deleted in that same transaction once the broker acknowledged them.

Every method runs in its own transaction on a pooled connection. When PostgreSQL is
unreachable the methods raise StoreUnavailable; callers wait and try again, they
never drop what they hold.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg_pool
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from redrive.headers import Header
from redrive.service.migrations import migrate

NOTIFY_CHANNEL = "redrive_pending"


class StoreUnavailable(Exception):
    """PostgreSQL could not be reached or failed mid-transaction; nothing was changed."""


def headers_as_json(headers: Sequence[Header]) -> list[list[str | None]]:
    """Headers as stored, losslessly: a JSON list of [name, base64 value or null].

    PostgreSQL's jsonb cannot hold a NUL character, so a name containing one (only a
    forged message would) is stored base64-encoded with a third element "b64".
    """
    items: list[list[str | None]] = []
    for name, value in headers:
        encoded = None if value is None else base64.b64encode(value).decode()
        if "\x00" in name:
            items.append([base64.b64encode(name.encode()).decode(), encoded, "b64"])
        else:
            items.append([name, encoded])
    return items


def headers_to_json(headers: Sequence[Header]) -> str:
    """:func:`headers_as_json` as JSON text."""
    return json.dumps(headers_as_json(headers))


def headers_from_json(stored: Any) -> list[Header]:
    items = json.loads(stored) if isinstance(stored, str | bytes) else stored
    headers: list[Header] = []
    for item in items:
        name = base64.b64decode(item[0]).decode() if len(item) > 2 else item[0]
        headers.append((name, None if item[1] is None else base64.b64decode(item[1])))
    return headers


def clean_text(text: str | None) -> str | None:
    """Text for a PostgreSQL text column, which cannot hold NUL: NUL becomes U+FFFD.

    Only display columns go through this; the raw headers are kept losslessly.
    """
    return None if text is None else text.replace("\x00", "\ufffd")


@dataclass(frozen=True, slots=True)
class RequestCoordinates:
    """Where a retry request was read from: its identity for idempotent inserts."""

    topic: str
    partition: int
    offset: int


@dataclass(slots=True)  # not frozen: built once per request, on the hot path
class PendingRetry:
    """A valid retry request, waiting for its due time."""

    due_ms: int
    destination: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    attempt: int
    group: str | None
    deadline_ms: int | None
    original_topic: str | None
    original_partition: int | None
    original_offset: int | None
    request: RequestCoordinates


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that will not be retried, with the reason why."""

    topic: str | None
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    reason_code: str
    reason: str
    source: str
    attempt: int | None = None
    group: str | None = None
    original_topic: str | None = None
    original_partition: int | None = None
    original_offset: int | None = None
    original_timestamp: int | None = None
    error_type: str | None = None
    error_message: str | None = None
    error_trace: str | None = None
    request: RequestCoordinates | None = None


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


_PENDING_COLUMNS = (
    "due_ms, destination, dest_partition, msg_key, msg_value, headers, attempt, group_id, "
    "deadline_ms, original_topic, original_partition, original_offset, "
    "request_topic, request_partition, request_offset"
)

# A batch is copied straight into place: COPY is the fastest way in, and psycopg
# writes its rows in C. Binary, because in text format every bytea value travels as
# hex (2 KiB for a 1 KiB message) that PostgreSQL then parses.
_COPY_PENDING = f"COPY redrive_pending ({_PENDING_COLUMNS}) FROM STDIN (FORMAT BINARY)"
_PENDING_TYPES = [  # the types of _PENDING_COLUMNS, in order
    "int8", "text", "int4", "bytea", "bytea", "jsonb", "int4", "text", "int8",
    "text", "int4", "int8", "text", "int4", "int8",
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
VALUES (%s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING
"""

# Row locks, not a lease column: locking writes no new row version and touches no
# index, where a lease UPDATE rewrote every row and all its index entries.
_CLAIM_DUE = """
SELECT id, due_ms, destination, dest_partition, msg_key, msg_value, headers, deadline_ms
FROM redrive_pending
WHERE due_ms <= %(now)s
ORDER BY due_ms, id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

# The first row free for the taking (rows another scheduler holds are skipped).
_NEXT_DUE = """
SELECT due_ms FROM redrive_pending ORDER BY due_ms, id LIMIT 1 FOR KEY SHARE SKIP LOCKED
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
    request_topic, request_partition, request_offset)
SELECT destination, msg_key, msg_value, headers, attempt, group_id, original_topic,
       original_partition, original_offset, %(code)s, %(reason)s, 'scheduler',
       request_topic, request_partition, request_offset
FROM moved
ON CONFLICT DO NOTHING
"""


_COUNT_MINUTE = """
INSERT INTO redrive_stats_minute (minute, kind, topic, count)
VALUES (date_trunc('minute', now()), %s, %s, %s)
ON CONFLICT (minute, kind, topic)
DO UPDATE SET count = redrive_stats_minute.count + EXCLUDED.count
"""

# Forget delivered rows and count them, in one statement.
_DELETE_DELIVERED = """
WITH gone AS (DELETE FROM redrive_pending WHERE id = ANY(%s) RETURNING destination)
INSERT INTO redrive_stats_minute (minute, kind, topic, count)
SELECT date_trunc('minute', now()), 'published', destination, count(*) FROM gone
GROUP BY destination
ON CONFLICT (minute, kind, topic)
DO UPDATE SET count = redrive_stats_minute.count + EXCLUDED.count
"""


def _per_topic(topics: Sequence[str | None]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for topic in topics:
        key = clean_text(topic) or ""
        counts[key] = counts.get(key, 0) + 1
    return sorted(counts.items())


def _pending_params(row: PendingRetry) -> tuple[Any, ...]:
    return (
        row.due_ms,
        row.destination,
        row.partition,
        row.key,
        row.value,
        Jsonb(headers_as_json(row.headers)),
        row.attempt,
        clean_text(row.group),
        row.deadline_ms,
        row.original_topic,
        row.original_partition,
        row.original_offset,
        row.request.topic,
        row.request.partition,
        row.request.offset,
    )


def _dead_params(row: DeadLetter) -> tuple[Any, ...]:
    req = row.request
    return (
        clean_text(row.topic),
        row.key,
        row.value,
        headers_to_json(row.headers),
        row.attempt,
        clean_text(row.group),
        clean_text(row.original_topic),
        row.original_partition,
        row.original_offset,
        row.original_timestamp,
        clean_text(row.error_type),
        clean_text(row.error_message),
        clean_text(row.error_trace),
        row.reason_code,
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


def _pool(url: str, name: str, max_size: int, timeout_s: float, **kwargs: Any) -> Any:
    return psycopg_pool.ConnectionPool(
        url,
        min_size=1,
        max_size=max_size,
        open=False,
        kwargs={"autocommit": True, "connect_timeout": 5, **kwargs},
        check=psycopg_pool.ConnectionPool.check_connection,
        # Keep trying for as long as the outage lasts: the service waits, never drops.
        reconnect_timeout=7 * 24 * 3600,
        timeout=timeout_s,
        name=name,
    )


def _to_dead_letters(
    conn: psycopg.Connection[Any], failures: Sequence[tuple[int, str, str]]
) -> None:
    with conn.cursor() as cur:
        topics = cur.execute(
            "SELECT destination FROM redrive_pending WHERE id = ANY(%s)",
            ([i for i, _, _ in failures],),
        ).fetchall()
        cur.executemany(
            _PENDING_TO_DEAD,
            [{"id": i, "code": code, "reason": reason} for i, code, reason in failures],
        )
        for topic, count in _per_topic([t[0] for t in topics]):
            cur.execute(_COUNT_MINUTE, ("dead_lettered", topic, count))


@dataclass(frozen=True, slots=True)
class Settlement:
    """What became of claimed rows: `delivered` ones are forgotten, `dead` ones (id,
    reason code, reason) move to the dead letters, and `retry` ones (a delivery failed
    for a passing reason) are due again at `retry_at_ms`."""

    delivered: Sequence[int] = ()
    dead: Sequence[tuple[int, str, str]] = ()
    retry: Sequence[int] = ()
    retry_at_ms: int = 0


def _settle(conn: psycopg.Connection[Any], settlement: Settlement) -> None:
    if settlement.delivered:
        conn.execute(_DELETE_DELIVERED, (list(settlement.delivered),))
    if settlement.dead:
        _to_dead_letters(conn, settlement.dead)
    if settlement.retry:
        conn.execute(_RELEASE, (settlement.retry_at_ms, list(settlement.retry)))


class Claim:
    """Rows one scheduler holds: locked in its open transaction until the claim ends."""

    def __init__(self, conn: psycopg.Connection[Any], rows: list[ClaimedRetry]) -> None:
        self._conn = conn
        self.rows = rows

    def settle(self, settlement: Settlement) -> None:
        """Record the outcome; it takes effect when the claim's transaction commits."""
        _settle(self._conn, settlement)


class Store:
    """Pooled access to the engine's tables.

    Two pools: `pool` commits durably (intake's inserts, which Kafka offsets are
    committed after, and operator actions); `relaxed` does not wait for the WAL to
    reach disk (synchronous_commit=off) and serves the scheduler's claims, deletes
    and releases. Losing one of those in a database crash only makes a row
    deliverable again: a duplicate delivery, never a lost one. It saves an fsync per
    scheduler step, which is most of a retry's lateness.

    `claim_timeout_s` bounds how long a scheduler may hold claimed rows: PostgreSQL
    ends a session idle in its claim transaction for longer (a hung instance), which
    frees the rows for the others.
    """

    def __init__(
        self,
        url: str,
        *,
        max_connections: int = 6,
        reconnect_max_s: float = 10.0,
        claim_timeout_s: float = 30.0,
    ):
        self.url = url
        self.pool = _pool(url, "redrive-store", max_connections, reconnect_max_s)
        relaxed = (
            "-c synchronous_commit=off "
            f"-c idle_in_transaction_session_timeout={max(int(claim_timeout_s * 1000), 1)}"
        )
        self.relaxed = _pool(url, "redrive-store-relaxed", 2, reconnect_max_s, options=relaxed)

    def open(self, *, wait_s: float = 30.0) -> None:
        """Open the pools, waiting for the database; then bring the schema up to date."""
        self.pool.open(wait=True, timeout=wait_s)
        with self._conn() as conn:
            migrate(conn)
        self.relaxed.open(wait=True, timeout=wait_s)

    def close(self) -> None:
        self.relaxed.close()
        self.pool.close()

    @contextmanager
    def _conn(self, *, relaxed: bool = False) -> Iterator[psycopg.Connection[Any]]:
        try:
            with (self.relaxed if relaxed else self.pool).connection() as conn:
                yield conn
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as exc:
            raise StoreUnavailable(str(exc).strip() or type(exc).__name__) from exc

    def ping(self) -> bool:
        try:
            with self._conn() as conn:
                conn.execute("SELECT 1")
            return True
        except StoreUnavailable:
            return False

    def insert_batch(self, pending: Sequence[PendingRetry], dead: Sequence[DeadLetter]) -> int:
        """Insert a batch durably in one transaction; a redelivered request is skipped.

        Returns how many pending rows were new. Schedulers listening on NOTIFY_CHANNEL
        learn the batch's earliest due time when the transaction commits.
        """
        inserted = 0
        with self._conn() as conn, conn.transaction(), conn.cursor() as cur:
            if pending:
                inserted = _insert_pending(conn, [_pending_params(row) for row in pending])
                earliest = min(r.due_ms for r in pending)
                cur.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, str(earliest)))
            if dead:
                cur.executemany(_INSERT_DEAD, [_dead_params(r) for r in dead])
            counts = [("scheduled", t, n) for t, n in _per_topic([r.destination for r in pending])]
            counts += [("dead_lettered", t, n) for t, n in _per_topic([r.topic for r in dead])]
            if counts:
                cur.executemany(_COUNT_MINUTE, counts)
        return inserted

    def insert_dead_letters(self, dead: Sequence[DeadLetter]) -> None:
        self.insert_batch((), dead)

    @contextmanager
    def claim_due(self, *, now_ms: int, limit: int) -> Iterator[Claim]:
        """Lock up to `limit` due rows nobody holds, in due order, for the `with` block.

        The rows stay locked (invisible to other schedulers' claims) until the block
        ends; what :meth:`Claim.settle` recorded is committed then. An exception, or a
        crash that drops the connection, rolls back: the rows are due again at once.
        """
        with self._conn(relaxed=True) as conn, conn.transaction():
            rows = conn.execute(_CLAIM_DUE, {"now": now_ms, "limit": limit}, binary=True)
            claimed = [
                ClaimedRetry(r[0], r[1], r[2], r[3], r[4], r[5], headers_from_json(r[6]), r[7])
                for r in rows
            ]
            yield Claim(conn, claimed)

    def settle(self, settlement: Settlement) -> None:
        """:meth:`Claim.settle` without a claim, in a transaction of its own: for an
        outcome whose claim could not commit (rows already gone are skipped)."""
        with self._conn(relaxed=True) as conn, conn.transaction():
            _settle(conn, settlement)

    def to_dead_letters(self, failures: Sequence[tuple[int, str, str]]) -> None:
        """Move rows that can never be delivered (id, reason code, reason) to dead letters."""
        if failures:
            with self._conn() as conn, conn.transaction():
                _to_dead_letters(conn, failures)

    def next_wake_ms(self) -> int | None:
        """The earliest due time of a row no scheduler holds, or None if there is none."""
        with self._conn(relaxed=True) as conn:
            row = conn.execute(_NEXT_DUE).fetchone()
        return None if row is None else int(row[0])

    def pending_by_destination(self) -> dict[str, int]:
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT destination, count(*) FROM redrive_pending GROUP BY destination"
            ).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def dead_letters(self, *, limit: int = 100) -> list[dict[str, Any]]:
        """Newest dead letters first (the search API comes with the UI)."""
        with self._conn() as conn, conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(
                "SELECT * FROM redrive_dead_letters ORDER BY dead_at DESC, id DESC LIMIT %s",
                (limit,),
            ).fetchall()
        for row in rows:
            row["headers"] = headers_from_json(row["headers"])
        return rows
