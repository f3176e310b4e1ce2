"""Replay jobs: a bulk replay's dead letters, how far it got, and who runs it.

Invariants the SQL keeps:

- a dead letter is `todo` or `sending` in at most one job (a unique partial index):
  a second job over letters a running job still has to send is refused;
- an item becomes `sending` only while its job row is locked and `running`, and a
  cancel takes the same lock and only touches `todo` items: a batch is either
  recorded as being sent before the cancel, or refused after it, never half;
- one runner at a time holds a job: a session advisory lock on its id, released by
  PostgreSQL when the runner's connection ends (a killed service frees it at once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

import psycopg
from psycopg.rows import class_row

from redrive.service.store import replay_rounds
from redrive.service.store.read_models import JobFailure, ReplayJob

LIVE: Final = ("todo", "sending")
# The advisory lock's first key: "rply"; the second is the job id (see try_lock).
_LOCK_CLASS: Final = 0x72706C79


class JobOverlap(Exception):
    """Some of the letters are still to be sent by another job."""

    def __init__(self, job_id: int, count: int) -> None:
        super().__init__(f"{count} of these dead letters are still to be sent by job {job_id}")
        self.job_id = job_id
        self.count = count


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a letter's copy went, in the transaction being committed."""

    letter_id: int
    topic: str
    partition: int
    offset: int


def create(
    conn: psycopg.Connection[Any],
    *,
    actor: str,
    role: str,
    destination: str | None,
    keep: bool,
    rate: float,
    filter_json: str | None,
    ids: Sequence[int],
    skipped: Mapping[int, str] | None = None,
    start_at: datetime | None = None,
) -> int:
    """A new job over `ids` (sent in this order), running, or scheduled when
    `start_at` is later than now; the letters of `skipped` are passed over (with why).
    JobOverlap if another job still has some of the others to send."""
    skipped = skipped or {}
    with conn.transaction():
        row = conn.execute(
            "INSERT INTO redrive_replay_jobs (actor, role, destination, keep, rate, filter,"
            " total, start_at, state, started_at)"
            " SELECT %(actor)s, %(role)s, %(destination)s, %(keep)s, %(rate)s,"
            " %(filter)s::jsonb, %(total)s, %(start_at)s, s.state,"
            " CASE WHEN s.state = 'running' THEN now() END"
            " FROM (SELECT CASE WHEN %(start_at)s::timestamptz > now() THEN 'scheduled'"
            " ELSE 'running' END AS state) s RETURNING id",
            {
                "actor": actor,
                "role": role,
                "destination": destination,
                "keep": keep,
                "rate": rate,
                "filter": filter_json,
                "total": len(ids),
                "start_at": start_at,
            },
        ).fetchone()
        assert row is not None
        job_id = int(row[0])
        try:
            with conn.transaction():
                conn.execute(
                    "INSERT INTO redrive_replay_job_items"
                    " (job_id, dead_letter_id, position, state, error)"
                    " SELECT %s, letter, position, CASE WHEN why IS NULL THEN 'todo'"
                    " ELSE 'skipped' END, why"
                    " FROM unnest(%s::bigint[], %s::text[]) WITH ORDINALITY"
                    " AS t(letter, why, position)",
                    (job_id, list(ids), [skipped.get(i) for i in ids]),
                )
        except psycopg.errors.UniqueViolation:
            other = live_job_of(conn, [i for i in ids if i not in skipped])
            raise JobOverlap(*(other or (0, 0))) from None
        # Nothing to send (every letter skipped): done at once, scheduled or not.
        conn.execute(
            "UPDATE redrive_replay_jobs SET state = 'done', finished_at = now(),"
            " started_at = coalesce(started_at, now())"
            " WHERE id = %s AND NOT EXISTS (SELECT 1 FROM redrive_replay_job_items"
            "  WHERE job_id = %s AND state = 'todo')",
            (job_id, job_id),
        )
    return job_id


def live_job_of(conn: psycopg.Connection[Any], ids: Sequence[int]) -> tuple[int, int] | None:
    """(job, how many of `ids`) of a job that still has some of `ids` to send."""
    row = conn.execute(
        "SELECT job_id, count(*) FROM redrive_replay_job_items"
        " WHERE dead_letter_id = ANY(%s) AND state IN ('todo', 'sending')"
        " GROUP BY job_id ORDER BY job_id LIMIT 1",
        (list(ids),),
    ).fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


_JOB_COLUMNS: Final = """
j.id, j.state, j.actor, j.role, j.destination, j.keep, j.rate, j.filter, j.total,
j.created_at, j.finished_at, j.cancelled_by, j.start_at, j.started_at,
count(*) FILTER (WHERE i.state = 'sent') AS sent,
count(*) FILTER (WHERE i.state = 'skipped') AS skipped,
count(*) FILTER (WHERE i.state = 'failed') AS failed,
count(*) FILTER (WHERE i.state = 'gone') AS gone,
count(*) FILTER (WHERE i.state = 'cancelled') AS cancelled
"""


def get(conn: psycopg.Connection[Any], job_id: int) -> ReplayJob | None:
    """The job with its counts by item state, or None."""
    with conn.cursor(row_factory=class_row(ReplayJob)) as cur:
        return cur.execute(
            f"SELECT {_JOB_COLUMNS} FROM redrive_replay_jobs j"
            " LEFT JOIN redrive_replay_job_items i ON i.job_id = j.id"
            " WHERE j.id = %s GROUP BY j.id".encode(),
            (job_id,),
        ).fetchone()


def newest(conn: psycopg.Connection[Any], *, before_id: int | None, limit: int) -> list[ReplayJob]:
    """Up to `limit` jobs with their counts, newest first, older than `before_id`."""
    where, params = ("TRUE", []) if before_id is None else ("j.id < %s", [before_id])
    with conn.cursor(row_factory=class_row(ReplayJob)) as cur:
        return cur.execute(
            f"SELECT {_JOB_COLUMNS} FROM redrive_replay_jobs j"
            " LEFT JOIN redrive_replay_job_items i ON i.job_id = j.id"
            f" WHERE {where} GROUP BY j.id ORDER BY j.id DESC LIMIT %s".encode(),
            [*params, limit],
        ).fetchall()


def failures(conn: psycopg.Connection[Any], job_id: int, *, limit: int) -> list[JobFailure]:
    """The job's refused (failed) and passed over (skipped) letters and why, in the
    job's order."""
    with conn.cursor(row_factory=class_row(JobFailure)) as cur:
        return cur.execute(
            "SELECT dead_letter_id, error, state FROM redrive_replay_job_items"
            " WHERE job_id = %s AND state IN ('failed', 'skipped') ORDER BY position LIMIT %s",
            (job_id, limit),
        ).fetchall()


def unfinished(conn: psycopg.Connection[Any]) -> list[int]:
    """Jobs a runner has work in: running, or with a batch whose outcome is unrecorded
    (a job cancelled while its runner was down still has that batch to settle)."""
    rows = conn.execute(
        "SELECT id FROM redrive_replay_jobs WHERE state = 'running'"
        " UNION SELECT DISTINCT job_id FROM redrive_replay_job_items WHERE state = 'sending'"
        " ORDER BY 1"
    ).fetchall()
    return [int(r[0]) for r in rows]


def start_due(conn: psycopg.Connection[Any]) -> list[int]:
    """Start the scheduled jobs whose time has come (their `started_at` is now)."""
    rows = conn.execute(
        "UPDATE redrive_replay_jobs SET state = 'running', started_at = now()"
        " WHERE state = 'scheduled' AND start_at <= now() RETURNING id"
    ).fetchall()
    return sorted(int(r[0]) for r in rows)


def next_start_s(conn: psycopg.Connection[Any]) -> float | None:
    """Seconds until the next scheduled job's time (by the database's clock, which
    :func:`start_due` reads too); None when no job is scheduled."""
    row = conn.execute(
        "SELECT extract(epoch FROM min(start_at) - now()) FROM redrive_replay_jobs"
        " WHERE state = 'scheduled'"
    ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def try_lock(conn: psycopg.Connection[Any], job_id: int) -> bool:
    """Hold the job for this session (until unlock or the session ends); False if
    another session holds it."""
    row = conn.execute(
        "SELECT pg_try_advisory_lock(%s, %s)", (_LOCK_CLASS, job_id % 2**31)
    ).fetchone()
    return bool(row and row[0])


def unlock(conn: psycopg.Connection[Any], job_id: int) -> None:
    conn.execute("SELECT pg_advisory_unlock(%s, %s)", (_LOCK_CLASS, job_id % 2**31))


def next_todo(conn: psycopg.Connection[Any], job_id: int, *, limit: int) -> list[int]:
    """The next letters to send, in the job's order."""
    rows = conn.execute(
        "SELECT dead_letter_id FROM redrive_replay_job_items"
        " WHERE job_id = %s AND state = 'todo' ORDER BY position LIMIT %s",
        (job_id, limit),
    ).fetchall()
    return [int(r[0]) for r in rows]


def sending(conn: psycopg.Connection[Any], job_id: int) -> list[Placed]:
    """The batch whose Kafka transaction's outcome is not recorded yet."""
    rows = conn.execute(
        "SELECT dead_letter_id, topic, kafka_partition, kafka_offset"
        " FROM redrive_replay_job_items WHERE job_id = %s AND state = 'sending'"
        " ORDER BY position",
        (job_id,),
    ).fetchall()
    return [Placed(int(r[0]), r[1], int(r[2]), int(r[3])) for r in rows]


def mark_sending(conn: psycopg.Connection[Any], job_id: int, placed: Sequence[Placed]) -> bool:
    """Record a batch as in its Kafka transaction, before that commits; False (and
    nothing recorded) if the job is no longer running: the caller aborts the batch."""
    with conn.transaction():
        row = conn.execute(
            "SELECT state FROM redrive_replay_jobs WHERE id = %s FOR UPDATE", (job_id,)
        ).fetchone()
        if row is None or row[0] != "running":
            return False
        conn.execute(
            "UPDATE redrive_replay_job_items i SET state = 'sending', topic = p.topic,"
            " kafka_partition = p.part, kafka_offset = p.off"
            " FROM unnest(%s::bigint[], %s::text[], %s::int[], %s::bigint[])"
            " AS p(letter, topic, part, off)"
            " WHERE i.job_id = %s AND i.dead_letter_id = p.letter AND i.state = 'todo'",
            (
                [p.letter_id for p in placed],
                [p.topic for p in placed],
                [p.partition for p in placed],
                [p.offset for p in placed],
                job_id,
            ),
        )
        return True


def settle_sending(conn: psycopg.Connection[Any], job_id: int, *, committed: bool) -> list[int]:
    """The batch's Kafka transaction committed (its items are sent, and their letters
    deleted unless the job keeps them) or aborted (its items are to do again, or
    cancelled if the job was). Ends the job when nothing is left; returns the ids
    recorded as sent."""
    with conn.transaction():
        job = conn.execute(
            "SELECT state, keep FROM redrive_replay_jobs WHERE id = %s FOR UPDATE", (job_id,)
        ).fetchone()
        if job is None:
            return []
        if committed:
            replay_rounds.record_batch(conn, job_id)
            rows = conn.execute(
                "UPDATE redrive_replay_job_items SET state = 'sent'"
                " WHERE job_id = %s AND state = 'sending' RETURNING dead_letter_id",
                (job_id,),
            ).fetchall()
            sent = sorted(int(r[0]) for r in rows)
            if not job[1]:
                conn.execute("DELETE FROM redrive_dead_letters WHERE id = ANY(%s)", (sent,))
        else:
            sent = []
            conn.execute(
                "UPDATE redrive_replay_job_items SET state = %s, topic = NULL,"
                " kafka_partition = NULL, kafka_offset = NULL"
                " WHERE job_id = %s AND state = 'sending'",
                ("todo" if job[0] == "running" else "cancelled", job_id),
            )
        _finish_if_done(conn, job_id)
        return sent


def set_items(
    conn: psycopg.Connection[Any],
    job_id: int,
    ids: Sequence[int],
    state: str,
    error: str | None = None,
) -> None:
    """Mark letters the runner will not send (`gone`, `failed` with why); ends the job
    when nothing is left."""
    with conn.transaction():
        conn.execute(
            "UPDATE redrive_replay_job_items SET state = %s, error = %s"
            " WHERE job_id = %s AND dead_letter_id = ANY(%s) AND state = 'todo'",
            (state, error, job_id, list(ids)),
        )
        _finish_if_done(conn, job_id)


def _finish_if_done(conn: psycopg.Connection[Any], job_id: int) -> None:
    conn.execute(
        "UPDATE redrive_replay_jobs SET state = 'done', finished_at = now()"
        " WHERE id = %s AND state = 'running' AND NOT EXISTS ("
        "  SELECT 1 FROM redrive_replay_job_items"
        "  WHERE job_id = %s AND state IN ('todo', 'sending'))",
        (job_id, job_id),
    )


def cancel(conn: psycopg.Connection[Any], job_id: int, who: str) -> str | None:
    """Cancel a running or scheduled job: its letters not yet sent stay dead letters.
    Returns the job's state before (None: no such job); only such a job changes."""
    with conn.transaction():
        row = conn.execute(
            "SELECT state FROM redrive_replay_jobs WHERE id = %s FOR UPDATE", (job_id,)
        ).fetchone()
        if row is None:
            return None
        if row[0] in ("running", "scheduled"):
            conn.execute(
                "UPDATE redrive_replay_jobs SET state = 'cancelled', cancelled_by = %s,"
                " finished_at = now() WHERE id = %s",
                (who, job_id),
            )
            conn.execute(
                "UPDATE redrive_replay_job_items SET state = 'cancelled'"
                " WHERE job_id = %s AND state = 'todo'",
                (job_id,),
            )
        return str(row[0])


def sent_ids(conn: psycopg.Connection[Any], job_id: int) -> list[int]:
    rows = conn.execute(
        "SELECT dead_letter_id FROM redrive_replay_job_items"
        " WHERE job_id = %s AND state = 'sent' ORDER BY position",
        (job_id,),
    ).fetchall()
    return [int(r[0]) for r in rows]


class ReplayJobStore:
    """The functions above, each in a transaction of its own on the store's pool
    (``Store.replay_jobs``)."""

    def __init__(self, connection: Callable[[], AbstractContextManager[psycopg.Connection[Any]]]):
        self._conn = connection

    def create(self, **job: Any) -> int:
        with self._conn() as conn:
            return create(conn, **job)

    def get(self, job_id: int, *, with_failures: bool = False) -> ReplayJob | None:
        """The job; with its refused letters (the first 100) when asked."""
        with self._conn() as conn:
            job = get(conn, job_id)
            if job is None or not with_failures or not (job.failed or job.skipped):
                return job
            return replace(job, failures=tuple(failures(conn, job_id, limit=100)))

    def newest(self, *, before_id: int | None = None, limit: int) -> list[ReplayJob]:
        with self._conn() as conn:
            return newest(conn, before_id=before_id, limit=limit)

    def live_job_of(self, ids: Sequence[int]) -> tuple[int, int] | None:
        with self._conn() as conn:
            return live_job_of(conn, ids)

    def unfinished(self) -> list[int]:
        with self._conn() as conn:
            return unfinished(conn)

    def start_due(self) -> list[int]:
        with self._conn() as conn:
            return start_due(conn)

    def next_start_s(self) -> float | None:
        with self._conn() as conn:
            return next_start_s(conn)

    @contextmanager
    def held(self, job_id: int) -> Iterator[bool]:
        """Hold the job while the block runs (True), or say another runner does."""
        with self._conn() as conn:
            if not try_lock(conn, job_id):
                yield False
                return
            try:
                yield True
            finally:
                if not conn.closed:
                    unlock(conn, job_id)

    def next_todo(self, job_id: int, *, limit: int) -> list[int]:
        with self._conn() as conn:
            return next_todo(conn, job_id, limit=limit)

    def sending(self, job_id: int) -> list[Placed]:
        with self._conn() as conn:
            return sending(conn, job_id)

    def mark_sending(self, job_id: int, placed: Sequence[Placed]) -> bool:
        with self._conn() as conn:
            return mark_sending(conn, job_id, placed)

    def settle_sending(self, job_id: int, *, committed: bool) -> list[int]:
        with self._conn() as conn:
            return settle_sending(conn, job_id, committed=committed)

    def set_items(
        self, job_id: int, ids: Sequence[int], state: str, error: str | None = None
    ) -> None:
        with self._conn() as conn:
            set_items(conn, job_id, ids, state, error)

    def cancel(self, job_id: int, who: str) -> str | None:
        with self._conn() as conn:
            return cancel(conn, job_id, who)

    def sent_ids(self, job_id: int) -> list[int]:
        with self._conn() as conn:
            return sent_ids(conn, job_id)
