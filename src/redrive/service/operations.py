"""What operators see and do: dead letters, pending retries, stats, the audit log.

The operator side of the service where it adds to the store's typed reads (the SQL
and the read models are in :mod:`redrive.service.store`): pages with cursors, making
a retry due or cancelling it, stories, the audit trail. What the store answers as is
(one letter, retry or replay job by id, the ids a filter matches, counting, deleting,
the totals and rates, the replay jobs' changes) is asked of the store directly. The
web layer checks the caller's role before calling a mutating method, and records the
action with :meth:`Operations.audit`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from redrive.reasons import DeadLetterReason
from redrive.service.filters import (
    AuditFilter,
    DeadLetterFilter,
    PendingFilter,
    decode_cursor,
    encode_cursor,
)
from redrive.service.refusals import Conflict
from redrive.service.store import (
    AuditEntry,
    AuditRecord,
    DeadLetter,
    Pending,
    ReplayJob,
    Store,
)
from redrive.service.stories import dead_letter_of, stories, with_rounds

T = TypeVar("T")


class PendingHeld(Conflict):
    """Making a retry due now refused: it is held in its key's queue, so it could not
    go anyway (behind its head), or it is out already (delivered, awaiting its
    consumer); `detail` says which."""


def _page(
    rows: list[T], limit: int, sort_key: Callable[[T], tuple[int, ...]]
) -> tuple[list[T], str | None]:
    """A page from `limit + 1` fetched rows: the extra row only says a next page exists;
    the cursor is the sort key of the page's last row."""
    page = rows[:limit]
    if len(rows) <= limit or not page:
        return page, None
    return page, encode_cursor(*sort_key(page[-1]))


def _by_id(row: DeadLetter | ReplayJob | AuditRecord) -> tuple[int, ...]:
    return (row.id,)


class Operations:
    def __init__(self, store: Store) -> None:
        self.store = store

    # ---------------------------------------------------------------- dead letters

    def dead_letters(
        self, flt: DeadLetterFilter, *, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[DeadLetter], str | None]:
        """Newest first; returns a page and the cursor of the next one (None at the end)."""
        before_id = decode_cursor(cursor, 1)[0] if cursor else None
        rows = self.store.find_dead_letters(flt, before_id=before_id, limit=limit + 1)
        return _page(rows, limit, _by_id)

    # ---------------------------------------------------------------- pending retries

    def pending(
        self, flt: PendingFilter, *, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[Pending], str | None]:
        """First due first; a page and the next cursor."""
        after = None
        if cursor:
            due, last_id = decode_cursor(cursor, 2)
            after = (due, last_id)
        rows = self.store.find_pending(flt, after=after, limit=limit + 1)
        return _page(rows, limit, lambda row: (row.due_ms, row.id))

    def retry_now(self, pending_id: int, now_ms: int) -> bool:
        """Make a pending retry due now (the scheduler is woken through NOTIFY); False if
        it is gone. PendingHeld if it is held in its key's queue: the queue's order
        stands, an operator cancels (or makes due) its head instead."""
        made = self.store.make_due(pending_id, now_ms)
        if made == "behind":
            row = self.store.pending_by_id(pending_id)
            head = f" (pending retry {row.queue_head_id})" if row else ""
            raise PendingHeld(
                f"pending retry {pending_id} waits behind its key's head{head}: a key's "
                "retries go in order, from their head; make the head due or cancel it instead"
            )
        if made == "delivered":
            raise PendingHeld(
                f"pending retry {pending_id} was delivered and waits for its consumer: the "
                "rows of its key behind it go when the consumer is done with its run (or "
                "when it is cancelled)"
            )
        return made == "due"

    def pending_queue(
        self, pending_id: int, *, limit: int = 50, cursor: str | None = None
    ) -> tuple[Pending, list[Pending], str | None] | None:
        """The key queue a pending retry is in, head first: the row, a page of the
        queue and the next cursor (no rows for a retry that keeps no order); None if
        the row is gone."""
        row = self.store.pending_by_id(pending_id)
        if row is None:
            return None
        if row.order_queue is None:
            return row, [], None
        after = None
        if cursor:
            offset, attempt, last_id = decode_cursor(cursor, 3)
            after = (offset, attempt, last_id)
        rows = self.store.pending_queue(row.order_queue, after=after, limit=limit + 1)
        # A queue's rows all have an original offset: it is what orders them.
        page, nxt = _page(rows, limit, lambda r: (r.original_offset or 0, r.attempt, r.id))
        return row, page, nxt

    def cancel(self, pending_id: int, actor: str) -> bool:
        """Move a pending retry to the dead letters (reason: cancelled by an operator)."""
        before = self.store.pending_by_id(pending_id)
        if before is None:
            return False
        reason = f"cancelled by operator {actor}"
        self.store.to_dead_letters([(pending_id, DeadLetterReason.CANCELLED, reason)])
        # Cancelling a head lets the next of its key go (key_queues.advance, which
        # wakes the schedulers).
        return self.store.pending_by_id(pending_id) is None

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
        original coordinates, from pending retries, history and dead letters; a dead
        letter's with the rounds of its replays (the loop guard's)."""
        steps = self.store.record_steps(key=key, topic=topic, partition=partition, offset=offset)
        found = stories(steps)
        letters = [letter for story in found if (letter := dead_letter_of(story)) is not None]
        return with_rounds(found, self.store.replay_rounds(letters) if letters else {})

    # ---------------------------------------------------------------- replay jobs

    def replay_jobs(
        self, *, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[ReplayJob], str | None]:
        before_id = decode_cursor(cursor, 1)[0] if cursor else None
        rows = self.store.replay_jobs.newest(before_id=before_id, limit=limit + 1)
        return _page(rows, limit, _by_id)

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
        self, flt: AuditFilter | None = None, *, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[AuditRecord], str | None]:
        """Newest first (every entry without a filter); a page and the next cursor."""
        before_id = decode_cursor(cursor, 1)[0] if cursor else None
        search = flt if flt is not None else AuditFilter()
        rows = self.store.audit_entries(search, before_id=before_id, limit=limit + 1)
        return _page(rows, limit, _by_id)
