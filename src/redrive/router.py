"""The failure router: what becomes of a record whose handling failed.

Both engines, the consumer library (:mod:`redrive.consumer`) and the Spark pipeline
(:mod:`redrive.spark.pipeline`), hand every failure of a record to :class:`Router` and
do what it returns; no other code chooses between a retry and a dead letter, or writes
their headers. It is pure: no consumer, no producer, no Spark; time comes from the
router's clock. What varies by caller is passed in: the group, where a retry goes
(:class:`RetryTarget`: the requests topic, a tier topic, a per-group topic, or nowhere
for a retry in place), where a dead letter goes and which topic it names as its home.

The path of one failure (:meth:`Router.route`):

1. The policy decides (:meth:`redrive.policy.Policy.decide`) from the failed attempt,
   the error, the first failure of a record retried in place, the original record
   timestamp and the deadline the record arrived with. A policy that raises (a broken
   ``retryable`` predicate, say) makes a dead letter, ``policy error: ...``.
2. A retry gets its request's contract headers (:func:`redrive.headers.next_request`)
   naming its destination, and its ``redrive-id``
   (:func:`redrive.headers.failure_request_id`: derived from the group, the record as
   read and the attempt, so a repeated hand-off writes the same id); a retry in
   place gets none (nothing is written). Headers that cannot be written (a value a
   forged header put out of range) make a dead letter instead, reason INVALID_REQUEST.
3. A dead letter gets the same headers with ``redrive-send-to: dlq`` and
   ``redrive-reason``, and the ``redrive-id`` of its failure (the one a retry of it
   would have), so that its receiver stores a repeated hand-off once; a replay of it
   is a new record, carrying only how many times it was replayed and from which
   letter (``record.replay``), which its requests and its next dead letter keep.
   Should even those be invalid, the letter keeps what it can and says why: a dead
   letter is never dropped.

A record that cannot reach its handler at all (headers unreadable, a value that does
not deserialize, redrive's own failure on it) is rejected without the policy:
:meth:`Router.reject`, a fatal dead letter.

Times are taken as headers can hold them: a negative record timestamp (Kafka's -1,
"none") is no timestamp, a deadline past the largest 64-bit time is that time, and a
forged attempt count at the top of its range leaves room for one more
(:func:`read_delivery`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeAlias

from redrive.clock import Clock, now_ms
from redrive.headers import (
    GIVE_UPS,
    MAX_INT32,
    MAX_INT64,
    GiveUp,
    Header,
    HeaderError,
    RetryHeaders,
    describe_error,
    failure_request_id,
    next_request,
    read_delivery_headers,
    request_id,
)
from redrive.policy import DeadLetter, DeadLetterReason, Policy, Retry


def header_time(ms: int | None) -> int | None:
    """A time as a header can hold it. A policy deadline counted from a far-future
    (forged) timestamp can pass the largest; a later deadline would mean nothing more."""
    return None if ms is None else min(ms, MAX_INT64)


def record_time(ms: int | None) -> int | None:
    """A record timestamp usable in the contract: None when it has none; the only
    negative time a producer may mean is -1, none, and a header cannot hold it."""
    return ms if ms is not None and 0 <= ms <= MAX_INT64 else None


def read_delivery(headers: Iterable[Header] | None, group: str) -> RetryHeaders | None:
    """What the redrive headers of a record say of its past, if they concern ``group``.

    None on a first delivery, and for another group's retry of a shared topic (new to
    this group). The headers may be forged or garbled (any producer can write them):
    the reader drops what is invalid, and an attempt count at the very top of its range
    is lowered by one so that counting one more failure stays within it."""
    delivery = read_delivery_headers(headers)
    if delivery is None or delivery.group not in (None, group):
        return None
    if delivery.attempt >= MAX_INT32:
        delivery = dataclasses.replace(delivery, attempt=MAX_INT32 - 1)
    return delivery


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """A record as read from its topic: where it comes from, and its contents."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    """The record's own timestamp as read (None or negative: none)."""
    key: bytes | None
    value: bytes | None
    headers: list[Header]


@dataclass(frozen=True, slots=True)
class FailedRecord(SourceRecord):
    """A record whose handling failed, as the router needs it.

    Its ``headers`` are the user's own (no ``redrive-*`` ones): they travel untouched.
    What its redrive headers said is in ``delivery``.
    """

    delivery: RetryHeaders | None
    """The redrive headers it arrived with, read by :func:`read_delivery` (None on a
    first delivery to this group)."""
    attempt: int
    """The attempt that failed: 1 on a first delivery, n + 1 after n failures."""
    replay: tuple[int, int] | None = None
    """``(redrive-replays, redrive-replay-of)`` of a record replayed from the retry
    service's dead letters (:func:`redrive.headers.read_replay`), kept in its requests
    and its dead letter (the service's loop guard counts the rounds); None: not one."""


@dataclass(frozen=True, slots=True)
class RetryTarget:
    """Where a retry request goes: written to ``topic`` (at ``partition``, None: by key),
    it names ``destination`` (at ``destination_partition``) as where to deliver the
    record when due."""

    topic: str
    destination: str
    partition: int | None = None
    destination_partition: int | None = None

    @classmethod
    def through(cls, requests_topic: str, destination: str, record: FailedRecord) -> RetryTarget:
        """Through a requests topic, for the retry service or the Spark scheduler to
        deliver: back to the partition it came from when it goes back to its own topic,
        so that a key's records stay together."""
        same = destination == record.topic
        return cls(requests_topic, destination, None, record.partition if same else None)


@dataclass(frozen=True, slots=True)
class Retried:
    """The policy retries the record: ``request`` is what to write to ``target`` (both
    None for a retry in place, which writes nothing)."""

    decision: Retry
    request: RetryHeaders | None = None
    target: RetryTarget | None = None

    @property
    def failed_at_ms(self) -> int:
        """When the failure was decided on (the router's clock)."""
        return self.decision.at_ms - self.decision.delay_ms


@dataclass(frozen=True, slots=True)
class DeadLettered:
    """The record is a dead letter: write it to ``topic`` with ``headers``."""

    decision: DeadLetter
    headers: RetryHeaders
    topic: str


Outcome: TypeAlias = Retried | DeadLettered


def policy_error_text(error: BaseException, policy_error: BaseException) -> str:
    info = describe_error(policy_error)
    return (
        f"policy error: deciding on {describe_error(error).type} raised {info.type}: {info.message}"
    )


@dataclass(frozen=True)
class Router:
    """Routes the failures of one group's records under one policy (see the module)."""

    policy: Policy
    group: str
    clock: Clock = field(default=now_ms, compare=False)

    def route(
        self,
        record: FailedRecord,
        error: BaseException,
        *,
        retry_to: RetryTarget | None,
        dead_letters: str,
        home: str,
        first_failure_ms: int | None = None,
    ) -> Outcome:
        """A retry or a dead letter for ``record``, whose attempt failed with ``error``.

        ``retry_to`` is where a retry goes (None: retried in place, nothing written);
        ``dead_letters`` the topic a dead letter is written to, and ``home`` the topic it
        names as its destination (where a replay delivers it). ``first_failure_ms`` is
        the first failure of a record retried in place (None: this one, or what its
        headers say)."""
        now = self.clock()
        delivery = record.delivery
        stamp = record_time(record.timestamp_ms)
        original = delivery.original_timestamp if delivery is not None else None
        try:
            decision = self.policy.decide(
                record.attempt,
                error,
                now_ms=now,
                first_failure_ms=first_failure_ms,
                record_timestamp_ms=original if original is not None else stamp,
                deadline_ms=delivery.deadline if delivery is not None else None,
            )
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as policy_error:  # noqa: BLE001 - a broken predicate, say
            text = policy_error_text(error, policy_error)
            decision = DeadLetter(DeadLetterReason.FATAL_ERROR, text, record.attempt)
        if isinstance(decision, DeadLetter):
            return self._dead_letter(record, error, decision, now, dead_letters, home)
        if retry_to is None:
            return Retried(decision)
        try:
            request = next_request(
                delivery,
                destination=retry_to.destination,
                retry_at=decision.at_ms,
                error=error,
                record_topic=record.topic,
                record_partition=record.partition,
                record_offset=record.offset,
                record_timestamp=stamp,
                deadline=header_time(decision.deadline_ms),
                group=self.group,
                partition=retry_to.destination_partition,
                attempt=decision.attempt,
                replay=record.replay,
            )
            request = dataclasses.replace(request, id=self._failure_id(record, request.attempt))
        except HeaderError as header_error:
            text = f"cannot write the retry request: {header_error}"
            dead = DeadLetter(DeadLetterReason.INVALID_REQUEST, text, record.attempt)
            return self._dead_letter(record, error, dead, now, dead_letters, home)
        return Retried(decision, request, retry_to)

    def reject(
        self,
        record: FailedRecord,
        error: BaseException,
        problem: str,
        *,
        dead_letters: str,
        home: str,
    ) -> DeadLettered:
        """A record that cannot reach its handler (``problem`` says why): a fatal dead
        letter, without asking the policy."""
        dead = DeadLetter(DeadLetterReason.FATAL_ERROR, f"fatal error: {problem}", record.attempt)
        return self._dead_letter(record, error, dead, self.clock(), dead_letters, home)

    def _failure_id(self, record: FailedRecord, attempt: int) -> str:
        delivered_as = record.delivery.id if record.delivery is not None else None
        read_at = (record.topic, record.partition, record.offset)
        return failure_request_id(self.group, attempt, read_at, delivered_as)

    def _dead_letter(
        self,
        record: FailedRecord,
        error: BaseException,
        dead: DeadLetter,
        now: int,
        dead_letters: str,
        home: str,
    ) -> DeadLettered:
        delivery = record.delivery
        try:
            headers = next_request(
                delivery,
                destination=home,
                retry_at=now,
                error=describe_error(error),
                record_topic=record.topic,
                record_partition=record.partition,
                record_offset=record.offset,
                record_timestamp=record_time(record.timestamp_ms),
                group=self.group,
                send_to="dlq",
                deadline=delivery.deadline if delivery is not None else None,
                reason=dead.text,
                reason_code=given_up(dead.reason),
                attempt=dead.attempt,
                replay=record.replay,
            )
            headers = dataclasses.replace(headers, id=self._failure_id(record, headers.attempt))
        except HeaderError as header_error:  # not expected: keep the letter, say why
            headers = RetryHeaders(
                destination=record.topic,
                retry_at=now,
                attempt=dead.attempt,
                send_to="dlq",
                group=self.group,
                reason=f"{dead.text} (headers incomplete: {header_error})",
                reason_code=given_up(dead.reason),
            )
        return DeadLettered(dead, headers, dead_letters)


def given_up(reason: DeadLetterReason) -> GiveUp | None:
    """A policy's reason to give up as ``redrive-reason-code`` says it (None for one it
    cannot say: only the policy's own reasons travel in the header)."""
    return reason.value if reason.value in GIVE_UPS else None


# ---------------------------------------------------------------- key order's requests
# What a consumer keeping key order writes besides retries and dead letters; their
# ``redrive-id`` is derived from their fields (:func:`redrive.headers.request_id`), so
# that the same one written again after a crash is the same request.


def put_behind(
    group: str, destination: str, read_at: tuple[str, int, int], timestamp_ms: int | None
) -> RetryHeaders:
    """A record of a held key (read at ``read_at``), put behind the record its key
    waits for: not handled, so not failed (attempt 0), due at once when its turn
    comes, back on ``destination`` at the partition it was read from."""
    topic, partition, offset = read_at
    request = RetryHeaders(
        destination=destination,
        retry_at=now_ms(),
        attempt=0,
        partition=partition,
        group=group,
        original_topic=topic,
        original_partition=partition,
        original_offset=offset,
        original_timestamp=timestamp_ms,
        order="behind",
    )
    return dataclasses.replace(request, id=request_id(request))


def moved_behind(group: str, delivery: RetryHeaders, read_at: tuple[str, int, int]) -> RetryHeaders:
    """The same delivery, moved behind the record before it in its key's line: its id,
    or for one written without, one naming where it was read (not the original
    coordinates, which any producer can write)."""
    return dataclasses.replace(
        delivery,
        retry_at=max(now_ms(), delivery.retry_at + 1),
        order="behind",
        id=delivery.id or failure_request_id(group, delivery.attempt, read_at, None),
    )


def released(group: str, delivery: RetryHeaders) -> RetryHeaders | None:
    """The release of a record of a key's queue the consumer is done with (handled, or
    a dead letter): the retry service may deliver the next. None when the delivery
    names no original record (not written by redrive: no queue to name)."""
    topic, partition = delivery.original_topic, delivery.original_partition
    offset = delivery.original_offset
    if topic is None or partition is None or offset is None:
        return None
    release = RetryHeaders(
        destination=delivery.destination,
        retry_at=now_ms(),
        attempt=delivery.attempt,
        group=group,
        original_topic=topic,
        original_partition=partition,
        original_offset=offset,
        order="release",
    )
    return dataclasses.replace(release, id=request_id(release))
