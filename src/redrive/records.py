"""What a retry request becomes: a pending retry, or a dead-letter record.

These are the records the retry service stores and the Spark scheduler keeps in its
state, plain data with no storage in them. :func:`redrive.requests.classify` makes
one of them from each request; the service's store writes them to PostgreSQL.
"""

from __future__ import annotations

from dataclasses import dataclass

from redrive.headers import FailureHistory, Header
from redrive.reasons import DeadLetterReason


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
class DeadLetterRecord(FailureHistory):
    """A message that will not be retried, kept whole, with the reason why.

    Not to be confused with :class:`redrive.policy.DeadLetter`, a policy's decision
    to give up: this is the message itself, as stored and published. Its group,
    original-* and error-* fields (keyword-only) are its request's, as
    :class:`redrive.headers.FailureHistory` declares them for both.
    """

    topic: str | None
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    reason_code: DeadLetterReason
    reason: str
    source: str
    """Who made it a dead letter: ``intake`` or ``scheduler``."""
    attempt: int | None = None
    request: RequestCoordinates | None = None
