"""Intake's writes: a batch of pending retries and dead letters, stored in one go.

A batch is stored in one durable transaction, idempotently: each request's identity
(:func:`redrive.requests.identity`) goes into ``redrive_accepted`` with it, and its
content (:func:`redrive.requests.content_of`). A request whose identity is there
already, with the same content (or one not known), is a repeat, dropped whatever became
of its first copy (pending, delivered, a dead letter, a release done): intake reading
again what it had not committed, a consumer handing a failure off again after a crash,
a Spark batch run again. One with other content is a forgery (:mod:`.forgeries`): a
dead letter under an identity of its own, stored in the same transaction, and the
request accepted first stays as it was. Within a batch, the first of an identity in
the order it was read is the one accepted. Intake may always insert a batch again
until it commits the batch's offsets. Schedulers listening on :data:`NOTIFY_CHANNEL`
learn the batch's earliest due time when the transaction commits.

Each letter's error group (:mod:`.error_groups`) is computed here, once, and stored
with it.

Invariant: a request is stored (as a pending row, a dead letter or a release) in the
transaction that records its identity, and never when its identity was recorded
before (a forgery's letter is stored under its own, recorded likewise); an identity
is kept ``repeat_window_days`` past the later of its acceptance and its due time
(:func:`prune_accepted`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg

from redrive.records import DeadLetterRecord, PendingRetry, Release, RequestCoordinates
from redrive.requests import Incoming
from redrive.service.fingerprints import Grouping
from redrive.service.store import forgeries, key_queues
from redrive.service.store.error_groups import grouping_of, record_groups
from redrive.service.store.forgeries import Accepted
from redrive.service.store.packed_headers import pack_headers
from redrive.service.store.rows import clean_text
from redrive.service.store.stats import COUNT_MINUTE, per_topic
from redrive.service.store.wakeups import notify_due

_PENDING_COLUMNS = (
    "due_ms, destination, dest_partition, msg_key, msg_value, headers, attempt, group_id, "
    "deadline_ms, original_topic, original_partition, original_offset, "
    "request_topic, request_partition, request_offset, order_queue, held"
)

# A batch is copied straight into place: COPY is the fastest way in, and psycopg
# writes its rows in C. Binary, because in text format every bytea value travels as
# hex (2 KiB for a 1 KiB message) that PostgreSQL then parses.
_COPY_PENDING = f"COPY redrive_pending ({_PENDING_COLUMNS}) FROM STDIN (FORMAT BINARY)"
_PENDING_TYPES = [  # the types of _PENDING_COLUMNS, in order
    "int8", "text", "int4", "bytea", "bytea", "bytea", "int4", "text", "int8",
    "text", "int4", "int8", "text", "int4", "int8", "bytea", "bool",
]  # fmt: skip
# Identities (with their contents) are copied in as the rows are. When one is there
# already (a repeat, or a forgery), that copy fails on the primary key; the batch's
# identities then go through a session-local staging table, from which one statement
# adds those that are new and returns them, and another reads what the others were
# accepted with (conflicts are rare: only then the extra round trips).
_COPY_ACCEPTED = (
    "COPY redrive_accepted (identity, keep_from_ms, content) FROM STDIN (FORMAT BINARY)"
)
_ACCEPTED_TYPES = ["bytea", "int8", "bytea"]
_STAGE_ACCEPTED = """
CREATE TEMP TABLE IF NOT EXISTS redrive_accepted_stage
    (LIKE redrive_accepted) ON COMMIT DELETE ROWS
"""
_COPY_STAGED = _COPY_ACCEPTED.replace("redrive_accepted", "redrive_accepted_stage", 1)
_INSERT_STAGED = """
INSERT INTO redrive_accepted (identity, keep_from_ms, content)
SELECT identity, keep_from_ms, content FROM redrive_accepted_stage
ON CONFLICT DO NOTHING
RETURNING identity
"""
_CONTENTS = "SELECT identity, content FROM redrive_accepted WHERE identity = ANY(%s)"
# A forgery's letter has an identity of its own (where it was read), recorded as any
# request's is: the forgery read again (intake stopped before its commit) is a repeat.
_ACCEPT_OWN = """
INSERT INTO redrive_accepted (identity, keep_from_ms, content)
SELECT * FROM unnest(%s::bytea[], %s::bigint[], %s::bytea[])
ON CONFLICT DO NOTHING
RETURNING identity
"""
_PRUNE_ACCEPTED = """
DELETE FROM redrive_accepted WHERE identity IN (
    SELECT identity FROM redrive_accepted WHERE keep_from_ms < %s LIMIT %s)
"""

DEFAULT_QUARANTINE_AFTER: Final = 3
"""A letter that came back dead after this many replays is quarantined (the service's
``quarantine_after_replays``)."""

_INSERT_DEAD = """
INSERT INTO redrive_dead_letters (
    topic, msg_key, msg_value, headers, attempt, group_id, original_topic,
    original_partition, original_offset, original_timestamp, error_type, error_message,
    error_trace, reason_code, reason, source, request_topic, request_partition, request_offset,
    fingerprint, error_group, replays, replay_of, quarantined_at, record_missing)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,
        %s, %s, %s, %s, CASE WHEN %s THEN now() END, %s)
ON CONFLICT DO NOTHING
RETURNING 1
"""


def _pending_params(row: PendingRetry) -> tuple[Any, ...]:
    return (
        row.due_ms,
        row.destination,
        row.partition,
        row.key,
        row.value,
        pack_headers(row.headers),
        row.attempt,
        clean_text(row.group),
        row.deadline_ms,
        row.original_topic,
        row.original_partition,
        row.original_offset,
        row.request.topic,
        row.request.partition,
        row.request.offset,
        row.order_queue,
        # A retry of a key's queue waits until key_queues.advance lets it go.
        row.order is not None,
    )


def _grouping(row: DeadLetterRecord) -> Grouping:
    return grouping_of(
        row.error_type, row.error_message, row.error_trace, row.reason_code.value, row.reason
    )


def _dead_params(
    row: DeadLetterRecord, grouping: Grouping, quarantine_after: int
) -> tuple[Any, ...]:
    """The letter's columns; quarantined (the loop guard) once it came back dead from
    its `quarantine_after`-th replay."""
    req = row.request
    replays = row.replays or 0
    return (
        clean_text(row.topic),
        row.key,
        row.value,
        pack_headers(row.headers),
        row.attempt,
        clean_text(row.group),
        clean_text(row.original_topic),
        row.original_partition,
        row.original_offset,
        row.original_timestamp,
        clean_text(row.error_type),
        clean_text(row.error_message),
        clean_text(row.error_trace),
        row.reason_code.value,
        clean_text(row.reason),
        row.source,
        req.topic if req else None,
        req.partition if req else None,
        req.offset if req else None,
        grouping.fingerprint,
        grouping.fingerprint,
        replays,
        row.replay_of,
        replays >= quarantine_after,
        row.record_missing,
    )


@dataclass(frozen=True, slots=True)
class Stored:
    """What became of a batch: how many pending rows it added, the repeats it dropped
    (requests whose identity was accepted before, or earlier in the batch, with the
    same content), the forgeries it refused (other requests under such an identity)
    and the ingested letters it had stored before (a dead-letter topic's records read
    again: intake stopped before it committed them)."""

    inserted: int
    repeats: list[Accepted] = field(default_factory=list)
    read_again: list[DeadLetterRecord] = field(default_factory=list)
    advanced: int = 0
    """Key queues whose next run may go now (their delivered records released)."""
    forged: list[Accepted] = field(default_factory=list)
    """The batch's records refused as forgeries: none of them was stored."""
    forgeries: list[DeadLetterRecord] = field(default_factory=list)
    """Their dead letters, stored (reason ``invalid_signature``, identities of their own)."""

    def letters(self, records: Sequence[DeadLetterRecord]) -> list[DeadLetterRecord]:
        """The dead letters stored of a batch whose letters were ``records``: those not
        dropped as repeats, read again or refused as forgeries, and the forgeries'."""
        if not self.repeats and not self.read_again and not self.forged:
            return list(records)
        dropped = {id(record) for record in [*self.repeats, *self.read_again, *self.forged]}
        kept = [record for record in records if id(record) not in dropped]
        return [*kept, *self.forgeries]


def _copy(
    cur: psycopg.Cursor[Any],
    statement: str,
    types: list[str],
    rows: Sequence[tuple[Any, ...]],
) -> None:
    with cur.copy(statement) as copy:
        copy.set_types(types)
        for row in rows:
            copy.write_row(row)


@dataclass(slots=True)
class _SortedOut:
    """A batch whose identities were not all new: which records (by their index in the
    batch) were accepted, and the others, repeats and forgeries."""

    accepted: set[int]
    repeats: list[Accepted]
    forged: list[Accepted]


_NOWHERE: Final = RequestCoordinates("", -1, -1)
_Identity = tuple[bytes | None, int, bytes | None]
"""What ``redrive_accepted`` records of a request: its identity, when the identity's
window starts, its content."""


def _accept(
    conn: psycopg.Connection[Any],
    records: Sequence[Accepted],
    identities: Sequence[_Identity],
) -> _SortedOut | None:
    """Record the identities of the batch's requests (``identities``: each record's,
    when its window starts, its content) in the open transaction: None when all were
    new, else which records were accepted and which were not."""
    try:
        with conn.transaction(), conn.cursor() as cur:  # a savepoint: undone on failure
            _copy(cur, _COPY_ACCEPTED, _ACCEPTED_TYPES, identities)
        return None
    except psycopg.errors.UniqueViolation:
        pass
    # The order they were read in: in a batch, the first of an identity is accepted.
    read = sorted(range(len(records)), key=lambda i: records[i].request or _NOWHERE)
    first: dict[bytes | None, int] = {}
    for i in read:
        first.setdefault(records[i].identity, i)
    with conn.cursor() as cur:
        cur.execute(_STAGE_ACCEPTED)
        _copy(cur, _COPY_STAGED, _ACCEPTED_TYPES, [identities[i] for i in first.values()])
        new = {row[0] for row in cur.execute(_INSERT_STAGED).fetchall()}
        known = [identity for identity in first if identity not in new]
        contents: dict[bytes | None, bytes | None] = dict(
            cur.execute(_CONTENTS, (known,)).fetchall()
        )
    accepted: set[int] = set()
    repeated: list[int] = []
    forged: list[Accepted] = []
    for i in read:
        record = records[i]
        if first[record.identity] == i and record.identity in new:
            accepted.add(i)
            contents[record.identity] = record.content
        elif forgeries.differs(contents.get(record.identity), record.content):
            forged.append(record)
        else:  # (an identity accepted meanwhile by another writer: not known, a repeat)
            repeated.append(i)
    return _SortedOut(accepted, [records[i] for i in sorted(repeated)], forged)


def _refuse(
    conn: psycopg.Connection[Any],
    forged: Sequence[Accepted],
    read: Sequence[Incoming],
    now_ms: int,
    repeats: list[Accepted],
) -> list[DeadLetterRecord]:
    """The letters of the batch's forgeries, each under an identity of its own, recorded
    in the open transaction; one recorded before (the forgery read again) is a repeat."""
    if not forged:
        return []
    letters = forgeries.letters_of(forged, read)
    own = [letter.identity for letter in letters]
    rows = conn.execute(_ACCEPT_OWN, (own, [now_ms] * len(own), [r.content for r in letters]))
    new = {row[0] for row in rows.fetchall()}
    refused = []
    for letter in letters:
        if letter.identity in new:
            new.discard(letter.identity)
            refused.append(letter)
        else:
            repeats.append(letter)
    return refused


def insert_batch(
    conn: psycopg.Connection[Any],
    pending: Sequence[PendingRetry],
    dead: Sequence[DeadLetterRecord],
    releases: Sequence[Release] = (),
    *,
    now_ms: int,
    quarantine_after: int = DEFAULT_QUARANTINE_AFTER,
    read: Sequence[Incoming] = (),
) -> Stored:
    """Store a batch in one transaction, counted, without its repeats, its forgeries as
    dead letters of their own. Key queues the batch touched (ordered retries, releases)
    let their heads go. ``read``: the batch's messages (a forged release's letter keeps
    its message, which a :class:`Release` does not)."""
    repeats: list[Accepted] = []
    forged: list[Accepted] = []
    refused: list[DeadLetterRecord] = []
    with conn.transaction(), conn.cursor() as cur:
        letters = [r for r in dead if r.identity is not None]  # not ingested ones
        records: list[Accepted] = [*pending, *releases, *letters]
        identities: list[_Identity] = [
            (r.identity, max(now_ms, r.due_ms), r.content) for r in pending
        ]
        identities += [(r.identity, now_ms, r.content) for r in releases]
        identities += [(r.identity, now_ms, r.content) for r in letters]
        sorted_out = _accept(conn, records, identities) if identities else None
        if sorted_out is not None:
            accepted, repeats, forged = sorted_out.accepted, sorted_out.repeats, sorted_out.forged
            first_release, first_letter = len(pending), len(pending) + len(releases)
            pending = [r for i, r in enumerate(pending) if i in accepted]
            releases = [r for i, r in enumerate(releases, first_release) if i in accepted]
            letters = [r for i, r in enumerate(letters, first_letter) if i in accepted]
            refused = _refuse(conn, forged, read, now_ms, repeats)
            dead = [*letters, *refused, *(r for r in dead if r.identity is None)]
        if pending:
            _copy(cur, _COPY_PENDING, _PENDING_TYPES, [_pending_params(r) for r in pending])
            notify_due(conn, min(r.due_ms for r in pending))
        queues = [q for q in (r.order_queue for r in pending) if q is not None]
        key_queues.supersede(conn, _retried(pending))
        key_queues.release(conn, releases)
        advanced = key_queues.advance(conn, [*queues, *(r.queue for r in releases)])
        read_again: list[DeadLetterRecord] = []
        if dead:
            dead = _insert_dead(cur, dead, read_again, quarantine_after)
        counts = [("scheduled", t, n) for t, n in per_topic([r.destination for r in pending])]
        counts += [("dead_lettered", t, n) for t, n in per_topic([r.topic for r in dead])]
        if counts:
            cur.executemany(COUNT_MINUTE, counts)
    return Stored(len(pending), repeats, read_again, advanced, forged, refused)


def _retried(pending: Sequence[PendingRetry]) -> list[key_queues.Retried]:
    """The records of key queues stored as their next attempt."""
    retried = [r for r in pending if r.order == "key"]
    return [
        (queue, r.original_offset, r.attempt)
        for r in retried
        if (queue := r.order_queue) is not None and r.original_offset is not None
    ]


def _insert_dead(
    cur: psycopg.Cursor[Any],
    dead: Sequence[DeadLetterRecord],
    read_again: list[DeadLetterRecord],
    quarantine_after: int,
) -> list[DeadLetterRecord]:
    """Insert the letters. A request's letter is new (its identity was accepted just
    now); an ingested one has no identity, so the unique index on where it was read
    says whether it was stored before: those go to ``read_again``. The letters stored."""
    requested = [r for r in dead if r.identity is not None]
    ingested = [r for r in dead if r.identity is None]
    groupings = {id(r): _grouping(r) for r in dead}  # each letter's group, computed once
    record_groups(cur, groupings.values())
    if requested:
        cur.executemany(
            _INSERT_DEAD, [_dead_params(r, groupings[id(r)], quarantine_after) for r in requested]
        )
    if not ingested:
        return requested
    params = [_dead_params(r, groupings[id(r)], quarantine_after) for r in ingested]
    cur.executemany(_INSERT_DEAD, params, returning=True)
    for letter in ingested:
        (requested if cur.fetchone() is not None else read_again).append(letter)
        cur.nextset()
    return requested


def prune_accepted(conn: psycopg.Connection[Any], *, before_ms: int, limit: int) -> int:
    """Forget up to ``limit`` identities whose window started before ``before_ms``."""
    return conn.execute(_PRUNE_ACCEPTED, (before_ms, limit)).rowcount
