"""The retry service's PostgreSQL store: pending retries, dead letters, stats, audit.

All SQL of the service is in this package, one module per idea; :class:`Store` is
its one door. Callers get typed methods, never a connection:

- :mod:`.intake_writes`: intake's batches of pending retries and dead letters, and
  the identities of the requests accepted (:mod:`.identity_backfill` fills them in
  for rows stored before they were kept) with their contents, which tell a repeat
  from a forgery (:mod:`.forgeries`);
- :mod:`.claims`: the scheduler's claims of due rows and what became of them;
- :mod:`.key_queues`: the retries of one key delivered in order, in runs;
- :mod:`.dead_letters`, :mod:`.pending`: what operators browse, delete and retry,
  found by the searches of :mod:`.searches`;
- :mod:`.error_groups`: the dead letters grouped by failure, each group's state
  (:mod:`.error_group_backfill` groups the letters stored before letters had groups);
- :mod:`.stats`: the per-minute counters and the dashboard's totals;
- :mod:`.history`: delivered retries kept for a while, and a record's steps;
- :mod:`.audit`: the log of operator actions;
- :mod:`.replay_jobs`: bulk replays run in the background (``Store.replay_jobs``);
- :mod:`.replay_rounds`: each replay of a letter and what came back (the loop guard);
- :mod:`.tokens`: the API tokens' names, roles and digests;
- :mod:`.wakeups`: the NOTIFY that wakes schedulers for rows due sooner;
- :mod:`.identity`: the store's own id, which intake names in its commits;
- :mod:`.read_models`: what the reads give, one typed value per row (nothing above
  the store reads a column by name);
- :mod:`.rows`: values between Python and the columns.

Every method runs in its own transaction on a pooled connection. When PostgreSQL is
unreachable the methods raise StoreUnavailable; callers wait and try again, they
never drop what they hold.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg_pool

from redrive.records import DeadLetterRecord, PendingRetry, Release
from redrive.requests import Incoming
from redrive.service.migrations import migrate
from redrive.service.store import (
    audit,
    claims,
    dead_letters,
    error_group_backfill,
    error_groups,
    fingerprint_refresh,
    history,
    identity,
    identity_backfill,
    intake_writes,
    pending,
    replay_rounds,
    stats,
    tokens,
)
from redrive.service.store.audit import AuditEntry
from redrive.service.store.claims import Claim, ClaimedRetry, DeadRow, Settlement
from redrive.service.store.intake_writes import Stored
from redrive.service.store.pending import MadeDue
from redrive.service.store.read_models import (
    AuditRecord,
    DeadLetter,
    ErrorGroup,
    GroupSurge,
    JobFailure,
    Pending,
    ReplayJob,
    ReplayRound,
    Step,
    StoredMessage,
)
from redrive.service.store.replay_jobs import JobOverlap, Placed, ReplayJobStore
from redrive.service.store.rows import Row
from redrive.service.store.searches import AuditSearch, DeadLetterSearch, PendingSearch
from redrive.service.store.wakeups import NOTIFY_CHANNEL

__all__ = [
    "MIGRATION_STEPS",
    "NOTIFY_CHANNEL",
    "AuditEntry",
    "AuditRecord",
    "Claim",
    "ClaimedRetry",
    "DeadLetter",
    "DeadLetterSearch",
    "DeadRow",
    "ErrorGroup",
    "GroupSurge",
    "JobFailure",
    "JobOverlap",
    "MadeDue",
    "Pending",
    "PendingSearch",
    "Placed",
    "ReplayJob",
    "ReplayJobStore",
    "ReplayRound",
    "Row",
    "Settlement",
    "Step",
    "Store",
    "StoreUnavailable",
    "Stored",
    "StoredMessage",
]


MIGRATION_STEPS = {
    **identity_backfill.AFTER,
    **error_group_backfill.AFTER,
    **fingerprint_refresh.AFTER,
}
"""What migrations need done in Python, by migration number."""


class StoreUnavailable(Exception):
    """PostgreSQL could not be reached or failed mid-transaction; nothing was changed."""


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


class Store:
    """Pooled access to the service's tables.

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
        keep_history: bool = False,
        quarantine_after_replays: int = intake_writes.DEFAULT_QUARANTINE_AFTER,
    ):
        self.keep_history = keep_history
        self.quarantine_after_replays = quarantine_after_replays
        self.pool = _pool(url, "redrive-store", max_connections, reconnect_max_s)
        relaxed = (
            "-c synchronous_commit=off "
            f"-c idle_in_transaction_session_timeout={max(int(claim_timeout_s * 1000), 1)}"
        )
        self.relaxed = _pool(url, "redrive-store-relaxed", 2, reconnect_max_s, options=relaxed)
        self.replay_jobs = ReplayJobStore(self._conn)

    def open(self, *, wait_s: float = 30.0) -> None:
        """Open the pools, waiting for the database; then bring the schema up to date."""
        self.pool.open(wait=True, timeout=wait_s)
        with self._conn() as conn:
            migrate(conn, after=MIGRATION_STEPS)
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

    def store_id(self) -> str:
        """This database's identity (32 hex digits), made once by its migration."""
        with self._conn() as conn:
            return identity.store_id(conn)

    def ping(self) -> bool:
        try:
            with self._conn() as conn:
                conn.execute("SELECT 1")
            return True
        except StoreUnavailable:
            return False

    # ------------------------------------------------------------------ intake

    def insert_batch(
        self,
        pending: Sequence[PendingRetry],
        dead: Sequence[DeadLetterRecord],
        releases: Sequence[Release] = (),
        *,
        now_ms: int,
        read: Sequence[Incoming] = (),
    ) -> Stored:
        """Insert a batch durably in one transaction, without its repeats (copies of
        requests accepted before: :mod:`.intake_writes`), its forgeries (other requests
        under their identities) dead letters of their own. ``releases`` let the next of
        their key queues go (:mod:`.key_queues`). ``read``: the batch's messages, which
        a forgery's letter keeps. Schedulers listening on NOTIFY_CHANNEL learn the
        batch's earliest due time when the transaction commits.
        """
        with self._conn() as conn:
            return intake_writes.insert_batch(
                conn,
                pending,
                dead,
                releases,
                now_ms=now_ms,
                quarantine_after=self.quarantine_after_replays,
                read=read,
            )

    def prune_accepted(self, *, before_ms: int, limit: int) -> int:
        """Forget up to `limit` accepted identities whose window started before then."""
        with self._conn(relaxed=True) as conn:
            return intake_writes.prune_accepted(conn, before_ms=before_ms, limit=limit)

    # ------------------------------------------------------------------ scheduler

    @contextmanager
    def claim_due(self, *, now_ms: int, limit: int) -> Iterator[Claim]:
        """Lock up to `limit` due rows nobody holds, in due order, for the `with` block.

        The rows stay locked (invisible to other schedulers' claims) until the block
        ends; what :meth:`Claim.settle` recorded is committed then. An exception, or a
        crash that drops the connection, rolls back: the rows are due again at once.
        """
        with self._conn(relaxed=True) as conn, conn.transaction():
            rows = claims.claim_due(conn, now_ms=now_ms, limit=limit)
            yield Claim(conn, rows, keep_history=self.keep_history)

    def settle(self, settlement: Settlement) -> None:
        """:meth:`Claim.settle` without a claim, in a transaction of its own: for an
        outcome whose claim could not commit (rows already gone are skipped)."""
        with self._conn(relaxed=True) as conn, conn.transaction():
            claims.settle(conn, settlement, keep_history=self.keep_history)

    def to_dead_letters(self, failures: Sequence[DeadRow]) -> None:
        """Move rows that can never be delivered (id, reason code, reason) to dead letters."""
        if failures:
            with self._conn() as conn, conn.transaction():
                claims.to_dead_letters(conn, failures)

    def next_wake_ms(self) -> int | None:
        """The earliest due time of a row no scheduler holds, or None if there is none."""
        with self._conn(relaxed=True) as conn:
            return claims.next_due_ms(conn)

    # ------------------------------------------------------------------ dead letters

    def find_dead_letters(
        self, search: DeadLetterSearch, *, before_id: int | None = None, limit: int
    ) -> list[DeadLetter]:
        """Up to `limit` letters matching `search`, newest first, older than
        `before_id` when given."""
        with self._conn() as conn:
            return dead_letters.newest(conn, search, before_id=before_id, limit=limit)

    def dead_letters_by_id(self, ids: Sequence[int]) -> list[DeadLetter]:
        """The letters of these ids that exist, by id."""
        with self._conn() as conn:
            return dead_letters.by_ids(conn, ids)

    def dead_letter_by_id(self, letter_id: int) -> DeadLetter | None:
        """The letter of this id, or None if it is gone (replayed or deleted)."""
        rows = self.dead_letters_by_id([letter_id])
        return rows[0] if rows else None

    def dead_letter_ids(self, search: DeadLetterSearch, *, limit: int) -> list[int]:
        """Ids `search` matches, oldest first (the order a replay sends them in)."""
        with self._conn() as conn:
            return dead_letters.ids(conn, search, limit=limit)

    def count_dead_letters(self, search: DeadLetterSearch) -> int:
        with self._conn() as conn:
            return dead_letters.count(conn, search)

    def dead_letter_topics(self, search: DeadLetterSearch) -> dict[str, int]:
        """How many letters `search` matches on each topic ("" for those without)."""
        with self._conn() as conn:
            return dead_letters.topic_counts(conn, search)

    def replayed(
        self, letter_id: int, *, actor: str, topic: str, partition: int | None, delete: bool
    ) -> None:
        """A single replay of the letter was acknowledged: its round recorded, and the
        letter deleted unless kept, in one transaction."""
        with self._conn() as conn, conn.transaction():
            replay_rounds.record_one(conn, letter_id, actor=actor, topic=topic, partition=partition)
            if delete:
                dead_letters.delete(conn, [letter_id])

    def replay_rounds(self, letter_ids: Sequence[int]) -> dict[int, list[ReplayRound]]:
        """The rounds of each letter's line (:mod:`.replay_rounds`), first first."""
        with self._conn() as conn:
            return replay_rounds.of_letters(conn, letter_ids)

    def delete_dead_letters(self, ids: Sequence[int]) -> list[int]:
        """Delete; returns the ids that existed."""
        with self._conn() as conn:
            return dead_letters.delete(conn, ids)

    def dead_letters(self, *, limit: int = 100) -> list[Row]:
        """The newest dead letters, every column (for checks and tools)."""
        with self._conn() as conn:
            return dead_letters.latest(conn, limit=limit)

    # ------------------------------------------------------------------ error groups

    def error_groups(
        self,
        *,
        order: str = "count",
        topic: str | None = None,
        muted: bool | None = None,
        limit: int = 50,
    ) -> list[ErrorGroup]:
        """Up to `limit` groups with letters, by `order`: "count" or "last_seen"."""
        with self._conn() as conn:
            return error_groups.listed(conn, order=order, topic=topic, muted=muted, limit=limit)

    def error_group(self, error_group: str) -> ErrorGroup | None:
        """The group with its figures, or None if it has no letter."""
        with self._conn() as conn:
            return error_groups.one(conn, error_group)

    def error_group_exists(self, error_group: str) -> bool:
        with self._conn() as conn:
            return error_groups.exists(conn, error_group)

    def mute_error_group(self, error_group: str, *, muted: bool, by: str) -> bool | None:
        """Mute or unmute; the state before, or None if there is no such group."""
        with self._conn() as conn:
            return error_groups.mute(conn, error_group, muted=muted, by=by)

    def move_to_error_group(self, letter_id: int, to: str) -> str | None:
        """Put the letter in group `to`; the group it was in, None if no such letter."""
        with self._conn() as conn:
            return error_groups.move(conn, letter_id, to)

    def error_group_surges(self, *, limit: int) -> list[GroupSurge]:
        """The groups with the most letters in the last hour, against their usual."""
        with self._conn() as conn:
            return error_groups.surges(conn, limit=limit)

    # ------------------------------------------------------------------ pending retries

    def find_pending(
        self, search: PendingSearch, *, after: tuple[int, int] | None = None, limit: int
    ) -> list[Pending]:
        """Up to `limit` retries matching `search`, first due first, after the
        (due_ms, id) sort key `after` when given."""
        with self._conn() as conn:
            return pending.first_due(conn, search, after=after, limit=limit)

    def pending_by_id(self, pending_id: int) -> Pending | None:
        with self._conn() as conn:
            return pending.by_id(conn, pending_id)

    def pending_queue(
        self, order_queue: bytes, *, after: tuple[int, int, int] | None = None, limit: int
    ) -> list[Pending]:
        """Up to `limit` rows of a key queue, head first, after the (original_offset,
        attempt, id) sort key `after` when given."""
        with self._conn() as conn:
            return pending.queue(conn, order_queue, after=after, limit=limit)

    def make_due(self, pending_id: int, now_ms: int) -> MadeDue:
        """Make a pending retry due now (the schedulers are woken): "due"; "gone" if it
        is gone; "behind" or "delivered" if it is held in its key's queue (unchanged)."""
        with self._conn() as conn:
            return pending.make_due(conn, pending_id, now_ms)

    def pending_by_destination(self) -> dict[str, int]:
        with self._conn() as conn:
            return pending.by_destination(conn)

    def oldest_due_ms(self) -> int | None:
        """The earliest due time of a retry that may be delivered, or None."""
        with self._conn() as conn:
            return pending.oldest_due_ms(conn)

    # ------------------------------------------------------------------ history

    def prune_history(self, *, older_than_s: float, limit: int) -> int:
        """Delete up to `limit` of the oldest history entries past retention."""
        with self._conn(relaxed=True) as conn:
            return history.prune(conn, older_than_s=older_than_s, limit=limit)

    def record_steps(
        self,
        *,
        key: bytes | None = None,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> list[Step]:
        """The steps of the records with this key or at these original coordinates,
        across pending retries, history and dead letters, in story order."""
        with self._conn() as conn:
            return history.steps(conn, key=key, topic=topic, partition=partition, offset=offset)

    # ------------------------------------------------------------------ stats

    def totals(self) -> dict[str, Any]:
        """Dead letters and pending retries now: totals and the largest groups."""
        with self._conn() as conn:
            return stats.totals(conn)

    def rates(self, minutes: int) -> dict[str, list[dict[str, Any]]]:
        """Per-minute counts of the last `minutes` minutes by kind, oldest first."""
        with self._conn() as conn:
            return stats.rates(conn, minutes)

    # ------------------------------------------------------------------ audit

    def append_audit(self, entry: AuditEntry) -> None:
        with self._conn() as conn:
            audit.append(conn, entry)

    def audit_entries(
        self, search: AuditSearch, *, before_id: int | None = None, limit: int
    ) -> list[AuditRecord]:
        """Up to `limit` audit entries `search` matches, newest first, older than
        `before_id` when given."""
        with self._conn() as conn:
            return audit.newest(conn, search, before_id=before_id, limit=limit)

    # ------------------------------------------------------------------ tokens

    def add_token(self, name: str, role: str, digest: str) -> bool:
        """Store a token's digest; False if a token of that name exists (even revoked)."""
        with self._conn() as conn:
            return tokens.insert(conn, name, role, digest)

    def revoke_token(self, name: str) -> bool:
        with self._conn() as conn:
            return tokens.revoke(conn, name)

    def list_tokens(self) -> list[tuple[str, str, object, object]]:
        """(name, role, created_at, revoked_at) of every token, by name."""
        with self._conn() as conn:
            return tokens.listed(conn)

    def live_token(self, digest: str) -> tuple[str, str, str] | None:
        """(name, role, digest) of the live token with this digest, if any."""
        with self._conn() as conn:
            return tokens.live_by_digest(conn, digest)
