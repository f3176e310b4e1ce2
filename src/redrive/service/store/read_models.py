"""What the store's reads give: one frozen value per row, typed, built inside the store.

Nothing above the store reads a column by name: the API's and the pages' views,
the replays and the stories read these attributes, which the type checker sees. The
attributes keep the columns' names (``msg_key``, ``dead_at``), so a reader of the SQL
finds them; the names users see (the API's JSON fields) are chosen in the web wing.

Every value comes decoded: headers as a header list, keys and values as bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from redrive.headers import Header


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """What every stored message holds, retry or dead letter: its row's id, its key
    and headers, the attempt that failed, and where its record was first consumed
    (group, original topic, partition and offset)."""

    id: int
    msg_key: bytes | None
    headers: list[Header]
    attempt: int
    group_id: str | None
    original_topic: str | None
    original_partition: int | None
    original_offset: int | None


@dataclass(frozen=True, slots=True)
class DeadLetter(StoredMessage):
    """A dead letter: the message, where it was first consumed, why it died."""

    topic: str | None
    msg_value: bytes | None
    original_timestamp: int | None
    error_type: str | None
    error_message: str | None
    error_trace: str | None
    reason_code: str
    reason: str | None
    source: str
    request_topic: str | None
    request_partition: int | None
    request_offset: int | None
    dead_at: datetime
    fingerprint: str | None = None
    """Its failure's fingerprint (:mod:`redrive.service.fingerprints`), computed once."""
    error_group: str | None = None
    """The error group it is in: its fingerprint, unless an operator moved it."""
    replays: int = 0
    """How many replays it had had when it came back dead (0: never replayed)."""
    replay_of: int | None = None
    """The letter it was last replayed from (its previous round), if it came back."""
    quarantined_at: datetime | None = None
    """When the loop guard quarantined it (None: not quarantined): it had come back
    dead after the service's ``quarantine_after_replays`` replays."""
    record_missing: bool = False
    """Its record is unknown (:attr:`redrive.records.DeadLetterRecord.record_missing`):
    it holds no key, value or headers to replay."""

    @property
    def quarantined(self) -> bool:
        return self.quarantined_at is not None


@dataclass(frozen=True, slots=True)
class Pending(StoredMessage):
    """A pending retry as read (a :class:`redrive.records.PendingRetry` is one to
    store), with its key queue's facts when it keeps its key's order (``order_queue``
    set): the queue's head and length, and this row's place in it (0: the head) when
    the read counted it (None: not counted)."""

    due_ms: int
    destination: str
    dest_partition: int | None
    msg_value: bytes | None
    deadline_ms: int | None
    request_topic: str | None
    request_partition: int | None
    request_offset: int | None
    received_at: datetime | None
    order_queue: bytes | None
    held: bool
    delivered_ms: int | None
    queue_head_id: int | None = None
    queue_length: int = 0
    queue_position: int | None = None


@dataclass(frozen=True, slots=True)
class Step(StoredMessage):
    """One step of a record's story, from any of the three tables: ``kind`` is
    "pending", "delivered" or "dead"; ``ended_at`` when it was delivered or died;
    the reason and error only for a dead letter (a retry's are in its headers)."""

    kind: str
    topic: str | None
    due_ms: int | None
    received_at: datetime | None
    ended_at: datetime | None
    reason_code: str | None
    reason: str | None
    error_type: str | None
    error_message: str | None


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """An entry of the audit log as read back: when, and the filter and detail parsed."""

    id: int
    at: datetime
    actor: str
    role: str
    action: str
    ids: list[int]
    filter: dict[str, Any] | None
    count: int
    detail: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class JobFailure:
    """A letter of a replay job not sent, and why: refused by the broker (failed), or
    passed over (skipped: quarantined)."""

    dead_letter_id: int
    error: str | None
    state: str = "failed"


@dataclass(frozen=True, slots=True)
class ReplayJob:
    """A replay job and its letters' counts by state; ``failures`` are its refused
    letters when the read asked for them (else empty)."""

    id: int
    state: str
    actor: str
    role: str
    destination: str | None
    keep: bool
    rate: float
    filter: dict[str, Any] | None
    total: int
    created_at: datetime
    finished_at: datetime | None
    cancelled_by: str | None
    sent: int
    failed: int
    gone: int
    cancelled: int
    skipped: int = 0
    start_at: datetime | None = None
    """When a scheduled job is to start (None: at once)."""
    started_at: datetime | None = None
    """When its runner started it (None: not yet)."""
    failures: tuple[JobFailure, ...] = ()


@dataclass(frozen=True, slots=True)
class ErrorGroup:
    """An error group with its letters' figures: how many, first and last seen, the
    topics and consumer groups they came from (the first few by name), its letters in
    each of the last 24 hours (oldest first), and whether it is muted."""

    error_group: str
    title: str
    muted: bool
    muted_by: str | None
    muted_at: datetime | None
    count: int
    first_seen: datetime
    last_seen: datetime
    topics: tuple[str, ...]
    consumer_groups: tuple[str, ...]
    hourly: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GroupSurge:
    """A group's letters in the last hour against its usual hourly count (the 24
    hours before that)."""

    error_group: str
    muted: bool
    last_hour: int
    usual_per_hour: float

    @property
    def ratio(self) -> float:
        """How far above its usual it is (the usual taken as at least 1 an hour, so
        that a new group's ratio is its count)."""
        return self.last_hour / max(self.usual_per_hour, 1.0)


@dataclass(frozen=True, slots=True)
class ReplayRound:
    """One replay of a dead letter (``letter_id``, its ``round``-th in its line): when,
    by whom (and which job), where to; and the letter it came back dead as, when, with
    which error (``returned_id`` None: it has not come back)."""

    id: int
    letter_id: int
    round: int
    replayed_at: datetime
    actor: str
    job_id: int | None
    topic: str
    kafka_partition: int | None
    returned_id: int | None
    returned_at: datetime | None
    error_type: str | None
    error_message: str | None
