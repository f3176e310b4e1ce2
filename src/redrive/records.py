"""What a retry request becomes: a pending retry, or a dead-letter record.

These are the records the retry service stores and the Spark scheduler keeps in its
state, plain data with no storage in them. :func:`redrive.requests.classify` makes
one of them from each request; the service's store writes them to PostgreSQL.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import NamedTuple

from redrive.headers import FailureHistory, Header, Order
from redrive.reasons import DeadLetterReason


class RequestCoordinates(NamedTuple):
    """Where a retry request was read from: its identity for idempotent inserts.

    A named tuple, not a frozen dataclass: one is built for every request intake reads,
    and a frozen dataclass's __init__ (three object.__setattr__ calls) was 3% of
    intake's interpreter time under benchmark 2.
    """

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
    identity: bytes
    """What a repeat of this request has too (:func:`redrive.requests.identity`)."""
    order: Order | None = None
    """``key`` or ``behind`` when the record keeps its key's order (``redrive-order``)."""
    content: bytes | None = None
    """What a repeat of it must carry too (:func:`redrive.requests.content_of`): a
    different request under its identity is a forgery. None: not known."""

    @property
    def order_queue(self) -> bytes | None:
        """The key's queue this retry joins (None: it keeps no order)."""
        if self.order is None:
            return None
        return order_queue(self.group, self.original_topic, self.original_partition, self.key)


@dataclass(frozen=True, slots=True)
class Release:
    """Not a retry: a consumer is done with the head of a key's queue (handled, or a
    dead letter), named by its original offset and attempt; the next may go."""

    queue: bytes
    original_offset: int
    attempt: int
    request: RequestCoordinates
    identity: bytes
    content: bytes | None = None
    """As :attr:`PendingRetry.content`."""


def order_queue(
    group: str | None, topic: str | None, partition: int | None, key: bytes | None
) -> bytes:
    """The identity of a key's queue: its group, original topic and partition, and the
    record key, as 16 bytes of BLAKE2b (a key may be megabytes; its queue id is not)."""
    fields = json.dumps([group, topic, partition], separators=(",", ":")).encode()
    digest = hashlib.blake2b(digest_size=16)
    digest.update(len(fields).to_bytes(4, "big") + fields)
    digest.update(b"\x00" if key is None else b"\x01" + key)
    return digest.digest()


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
    identity: bytes | None = None
    """The identity of the request that became this letter; None when it was not a
    request (a record ingested from a dead-letter topic, a retry the scheduler gave up)."""
    content: bytes | None = None
    """As :attr:`PendingRetry.content`."""
    record_missing: bool = False
    """It names a record it does not hold, and the record could not be read (a share
    group's letter read after its topic dropped the record): its key, value and
    headers are unknown, so a replay of it would write an empty record."""
