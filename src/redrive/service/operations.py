"""What operators see and do: dead letters, pending retries, stats, the audit log.

The operator side of the service, over the store's typed methods (the SQL is in
:mod:`redrive.service.store`): pages with cursors, cancels, the audit trail. The web
layer checks the caller's role before calling a mutating method, and records the
action with :meth:`Operations.audit`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from redrive.reasons import DeadLetterReason
from redrive.service.filters import (
    DeadLetterFilter,
    PendingFilter,
    decode_cursor,
    encode_cursor,
)
from redrive.service.store import AuditEntry, Row, Store
from redrive.service.stories import stories


class PendingHeld(Exception):
    """Making a retry due now refused: it is held in its key's queue, so it could not
    go anyway (behind its head), or it is out already (delivered, awaiting its
    consumer). `status` is the HTTP status it is answered with; `detail` says why."""

    status = 409

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


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
        before_id = decode_cursor(cursor, 1)[0] if cursor else None
        rows = self.store.find_dead_letters(flt, before_id=before_id, limit=limit + 1)
        return _page(rows, limit, "id")

    def dead_letter(self, letter_id: int) -> Row | None:
        rows = self.store.dead_letters_by_id([letter_id])
        return rows[0] if rows else None

    def dead_letters_by_id(self, ids: Sequence[int]) -> list[Row]:
        return self.store.dead_letters_by_id(ids)

    def dead_letter_ids(self, flt: DeadLetterFilter, *, limit: int) -> list[int]:
        """Ids a filter matches, oldest first (the order a replay sends them in)."""
        return self.store.dead_letter_ids(flt, limit=limit)

    def count_dead_letters(self, flt: DeadLetterFilter) -> int:
        return self.store.count_dead_letters(flt)

    def delete_dead_letters(self, ids: Sequence[int]) -> list[int]:
        """Delete; returns the ids that existed."""
        return self.store.delete_dead_letters(ids)

    # ---------------------------------------------------------------- pending retries

    def pending(
        self, flt: PendingFilter, *, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[Row], str | None]:
        """First due first; a page and the next cursor."""
        after = None
        if cursor:
            due, last_id = decode_cursor(cursor, 2)
            after = (due, last_id)
        rows = self.store.find_pending(flt, after=after, limit=limit + 1)
        return _page(rows, limit, "due_ms", "id")

    def pending_one(self, pending_id: int) -> Row | None:
        return self.store.pending_by_id(pending_id)

    def retry_now(self, pending_id: int, now_ms: int) -> bool:
        """Make a pending retry due now (the scheduler is woken through NOTIFY); False if
        it is gone. PendingHeld if it is held in its key's queue: the queue's order
        stands, an operator cancels (or makes due) its head instead."""
        made = self.store.make_due(pending_id, now_ms)
        if made == "behind":
            row = self.pending_one(pending_id)
            head = f" (pending retry {row['queue_head_id']})" if row else ""
            raise PendingHeld(
                f"pending retry {pending_id} waits behind its key's head{head}: a key's "
                "retries go one at a time, in order; make the head due or cancel it instead"
            )
        if made == "delivered":
            raise PendingHeld(
                f"pending retry {pending_id} was delivered and waits for its consumer: the "
                "next of its key goes when the consumer is done with it (or when it is "
                "cancelled)"
            )
        return made == "due"

    def pending_queue(
        self, pending_id: int, *, limit: int = 50, cursor: str | None = None
    ) -> tuple[Row, list[Row], str | None] | None:
        """The key queue a pending retry is in, head first: the row, a page of the
        queue and the next cursor (no rows for a retry that keeps no order); None if
        the row is gone."""
        row = self.pending_one(pending_id)
        if row is None:
            return None
        if row["order_queue"] is None:
            return row, [], None
        after = None
        if cursor:
            offset, attempt, last_id = decode_cursor(cursor, 3)
            after = (offset, attempt, last_id)
        rows = self.store.pending_queue(row["order_queue"], after=after, limit=limit + 1)
        page, nxt = _page(rows, limit, "original_offset", "attempt", "id")
        return row, page, nxt

    def cancel(self, pending_id: int, actor: str) -> bool:
        """Move a pending retry to the dead letters (reason: cancelled by an operator)."""
        before = self.pending_one(pending_id)
        if before is None:
            return False
        reason = f"cancelled by operator {actor}"
        self.store.to_dead_letters([(pending_id, DeadLetterReason.CANCELLED, reason)])
        # Cancelling a head lets the next of its key go (key_queues.advance, which
        # wakes the schedulers).
        return self.pending_one(pending_id) is None

    # ---------------------------------------------------------------- stories

    def find_records(
        self,
        *,
        key: bytes | None = None,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> list[dict[str, Any]]:
        """Where is my record? The stories of the records with this key, or at these
        original coordinates, from pending retries, history and dead letters."""
        steps = self.store.record_steps(key=key, topic=topic, partition=partition, offset=offset)
        return stories(steps)

    # ---------------------------------------------------------------- replay jobs

    def create_replay_job(
        self,
        *,
        actor: str,
        role: str,
        destination: str | None,
        keep: bool,
        rate: float,
        flt: DeadLetterFilter | None,
        ids: Sequence[int],
    ) -> int:
        """A running job over `ids`; JobOverlap if a running job still has some."""
        return self.store.replay_jobs.create(
            actor=actor,
            role=role,
            destination=destination,
            keep=keep,
            rate=rate,
            filter_json=None if flt is None else flt.model_dump_json(exclude_none=True),
            ids=ids,
        )

    def replay_job(self, job_id: int) -> Row | None:
        """The job with its counts (sent, failed, gone, cancelled) and refusals."""
        job = self.store.replay_jobs.get(job_id)
        if job is not None:
            job["failures"] = self.store.replay_jobs.failures(job_id) if job["failed"] else []
        return job

    def replay_jobs(
        self, *, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[Row], str | None]:
        before_id = decode_cursor(cursor, 1)[0] if cursor else None
        rows = self.store.replay_jobs.newest(before_id=before_id, limit=limit + 1)
        return _page(rows, limit, "id")

    def live_replay_job_of(self, ids: Sequence[int]) -> int | None:
        """A running job that still has some of these letters to send."""
        found = self.store.replay_jobs.live_job_of(ids)
        return None if found is None else found[0]

    def cancel_replay_job(self, job_id: int, who: str) -> str | None:
        """Cancel a running job; the state it had (None: no such job)."""
        return self.store.replay_jobs.cancel(job_id, who)

    # ---------------------------------------------------------------- stats

    def stats(self) -> dict[str, Any]:
        return self.store.totals()

    def rates(self, minutes: int) -> dict[str, list[dict[str, Any]]]:
        """Per-minute counts of the last `minutes` minutes, by kind (all topics summed),
        with zero for quiet minutes, oldest first."""
        return self.store.rates(minutes)

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
        self.store.append_audit(
            AuditEntry(
                actor,
                role,
                action,
                ids,
                None if flt is None else flt.model_dump_json(exclude_none=True),
                count,
                None if detail is None else json.dumps(detail),
            )
        )

    def audit_log(
        self, *, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[Row], str | None]:
        before_id = decode_cursor(cursor, 1)[0] if cursor else None
        rows = self.store.audit_entries(before_id=before_id, limit=limit + 1)
        return _page(rows, limit, "id")
