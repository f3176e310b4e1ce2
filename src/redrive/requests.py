"""What becomes of one message on the requests topic: request classification.

`classify` turns a request into a PendingRetry, or into a DeadLetterRecord whose
reason says exactly what was wrong.

A header is input, not truth: a request is named by the identity it claims
(``redrive-id``) only once it is accepted. A refused one (a forged signature, a
destination not allowed...) is a dead letter under an identity of its own, where it
was read, unless one of our keys vouches for its sender: a forgery carrying a genuine
request's id never takes that id from it. Each record also carries its content
(:func:`content_of`: its key, its value and whether a key of ours vouched for it),
which a repeat under its identity must carry too. The retry service's intake and the Spark
scheduler both use it, so a request is judged the same by either. It is pure (the
allowlist and topic metadata come in as functions), so the catalogue of bad
requests is tested without a broker, and nothing here can raise on bad input
(only the metadata lookup may, when the broker cannot answer): every request ends
as one or the other.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Final

from confluent_kafka import Message

from redrive.headers import (
    DESTINATION,
    ERROR_MESSAGE,
    ERROR_TYPE,
    GROUP,
    MAX_ERROR_MESSAGE_BYTES,
    MAX_TOPIC_LENGTH,
    MAX_VALUE_BYTES,
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TOPIC,
    Header,
    HeaderError,
    RetryHeaders,
    decode,
    failure_id,
    split_headers,
)
from redrive.kafka import message_time, read_headers
from redrive.reasons import DeadLetterReason
from redrive.records import (
    DeadLetterRecord,
    PendingRetry,
    Release,
    RequestCoordinates,
    order_queue,
)
from redrive.signing import Judgement, SignatureCheck, value_digest

SOURCE: Final = "intake"
FORGED: Final = "invalid signature: a different request under the redrive-id of one accepted before"
"""Why a request under an accepted identity with other content is refused (a dead
letter's reason, reason code ``invalid_signature``): the service's and the Spark
scheduler's words alike."""


@dataclass(slots=True)  # not frozen: built once per request, on the hot path
class Incoming:
    """The parts of a consumed request message that intake looks at."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    # What could not be read of the headers (see redrive.kafka.read_headers), if any.
    header_problem: str | None = None
    timestamp_ms: int | None = None
    """The message's own timestamp (None: it has none, :func:`redrive.kafka.message_time`)."""

    @classmethod
    def from_message(cls, msg: Message) -> Incoming:
        """From a consumed message (one without error, so it has its coordinates)."""
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        if topic is None or partition is None or offset is None:
            raise ValueError("a message without coordinates is an error event, not a request")
        headers, problem = read_headers(msg)
        timestamp = message_time(msg)
        return cls(topic, partition, offset, msg.key(), msg.value(), headers, problem, timestamp)

    @property
    def coordinates(self) -> RequestCoordinates:
        return RequestCoordinates(self.topic, self.partition, self.offset)


@dataclass(frozen=True)
class IntakeRules:
    """What intake checks a request against."""

    destination_allowed: Callable[[str], bool]
    partitions_of: Callable[[str], int | None]  # None: the topic does not exist
    max_delay_ms: int
    keeps_order: bool = True
    """Whether the reader keeps a key's queue (``redrive-order``): the retry service
    does, the Spark scheduler does not, and refuses what would need it."""
    signatures: SignatureCheck | None = None
    """What is asked of a request's ``redrive-signature``; None: nothing (no keys)."""


def classify(
    msg: Incoming, rules: IntakeRules, now_ms: int
) -> PendingRetry | DeadLetterRecord | Release:
    """A valid request becomes a pending retry (or, with ``redrive-order: release``, a
    :class:`Release` of its key's queue); anything else a dead letter with its reason."""
    if msg.header_problem is not None:
        # Some headers are gone: even a request that decodes may have lost one that
        # mattered (its deadline, its group), so it is not scheduled on a guess.
        return _dead(
            msg, None, DeadLetterReason.INVALID_REQUEST, f"invalid request: {msg.header_problem}"
        )
    try:
        request, _ = decode(msg.headers)
    except HeaderError as error:
        return _dead(msg, None, DeadLetterReason.INVALID_REQUEST, f"invalid request: {error}")

    judged = _UNJUDGED
    digest = value_digest(msg.value)  # hashed once: for the signature and the content
    if rules.signatures is not None:
        # First: nothing a request asks is looked at before its sender is known.
        judged = rules.signatures.judge(
            msg.headers, msg.key, msg.value, request.signature, value_digest=digest
        )
    content = content_of(msg.key, msg.value, vouched=judged.vouched, value_digest=digest)

    def dead(code: DeadLetterReason, reason: str) -> DeadLetterRecord:
        """A refusal: under the identity it claims only if a key of ours vouches for it."""
        claimed = identity(request, msg.coordinates) if judged.vouched else None
        return _dead(msg, request, code, reason, claimed, content)

    if judged.refusal is not None:
        return dead(DeadLetterReason.INVALID_SIGNATURE, f"invalid signature: {judged.refusal}")
    if request.order is not None:
        refused = _order_problem(request, rules)
        if refused is not None:
            return dead(DeadLetterReason.INVALID_REQUEST, f"invalid request: {refused}")
        if request.order == "release":
            assert request.original_offset is not None  # _order_problem checked it
            queue = order_queue(
                request.group, request.original_topic, request.original_partition, msg.key
            )
            return Release(
                queue,
                request.original_offset,
                request.attempt,
                msg.coordinates,
                identity(request, msg.coordinates),
                content,
            )
    if not rules.destination_allowed(request.destination):
        return dead(
            DeadLetterReason.DESTINATION_NOT_ALLOWED,
            f"destination not allowed: {request.destination!r} is not in the allowlist",
        )
    if request.send_to == "dlq":
        why = f": {request.reason}" if request.reason else ""
        # Why its consumer gave up, if it says (redrive-reason-code): fatal or spent.
        given = request.reason_code
        # Not a refusal: the letter its consumer asked for, accepted under its id.
        return _dead(
            msg,
            request,
            DeadLetterReason(given) if given else DeadLetterReason.SENT_TO_DLQ,
            "sent to the dead letters by its consumer "
            f"(redrive-send-to: dlq) after attempt {request.attempt}{why}",
            identity(request, msg.coordinates),
            content,
        )
    # A record waiting behind its key's head is delivered as it was written, a
    # tombstone (no value) too: it is part of the key's order.
    if not msg.value and request.order != "behind":
        return dead(
            DeadLetterReason.EMPTY_VALUE,
            "empty value: a retry request must carry the message to deliver",
        )
    if request.deadline is not None and request.deadline < now_ms:
        return dead(
            DeadLetterReason.DEADLINE_PASSED,
            f"deadline passed: redrive-deadline {request.deadline} is "
            f"{now_ms - request.deadline} ms before it reached the retry service",
        )
    if request.deadline is not None and request.retry_at > request.deadline:
        return dead(
            DeadLetterReason.DEADLINE_PASSED,
            f"due after its deadline: redrive-retry-at {request.retry_at} is later than "
            f"redrive-deadline {request.deadline}",
        )
    if request.retry_at > now_ms + rules.max_delay_ms:
        days = (request.retry_at - now_ms) / 86_400_000
        limit = rules.max_delay_ms / 86_400_000
        return dead(
            DeadLetterReason.RETRY_AT_TOO_FAR,
            f"redrive-retry-at is {days:.1f} days ahead; the limit is {limit:g} days "
            "(setting max_delay_days)",
        )
    partitions = rules.partitions_of(request.destination)
    if partitions is None:
        return dead(
            DeadLetterReason.UNKNOWN_DESTINATION,
            f"destination topic {request.destination!r} does not exist",
        )
    if request.partition is not None and request.partition >= partitions:
        return dead(
            DeadLetterReason.PARTITION_OUT_OF_RANGE,
            f"redrive-partition {request.partition} does not exist: "
            f"{request.destination!r} has {partitions} partition(s)",
        )
    where = msg.coordinates
    # Delivered with its signature: its reader believes its redrive headers only then
    # (redrive.returns), and the signature names the topic it is delivered to.
    headers = msg.headers
    return PendingRetry(
        due_ms=request.retry_at,
        destination=request.destination,
        partition=request.partition,
        key=msg.key,
        value=msg.value,
        headers=headers,
        attempt=request.attempt,
        group=request.group,
        deadline_ms=request.deadline,
        original_topic=request.original_topic,
        original_partition=request.original_partition,
        original_offset=request.original_offset,
        request=where,
        identity=identity(request, where),
        order=request.order,
        content=content,
    )


_UNJUDGED: Final = Judgement(None, vouched=False)


def content_of(
    key: bytes | None,
    value: bytes | None,
    *,
    vouched: bool,
    value_digest: bytes | None = None,
) -> bytes:
    """What two copies of one request share, 16 bytes: the record (its key and value)
    and whether a key of ours vouched for its sender. A sender's repeat of a hand-off
    (after a crash, a Spark batch run again) is of the same record, signed again if it
    was signed; a request under an accepted identity with other content is a forgery
    (another value, or an unsigned copy of a signed request). ``value_digest``: the
    value's SHA-256, when the caller has it (:func:`redrive.signing.value_digest`)."""
    if value is not None and value_digest is None:
        value_digest = hashlib.sha256(value).digest()
    parts = [b"v" if vouched else b"u"]
    parts.append(b"-" if key is None else b"%d:%s" % (len(key), key))
    parts.append(b"-" if value_digest is None else value_digest)
    return hashlib.sha256(b"".join(parts)).digest()[:16]


def identity(request: RetryHeaders | None, coordinates: RequestCoordinates) -> bytes:
    """What makes a request the same as another, 16 bytes: a repeat of it carries the
    same, whoever repeats it (a consumer handing a failure off again after a crash, a
    Spark batch run again, intake reading again what it had not committed).

    Its ``redrive-id``; for a request without one, what the id is made of (its group,
    original coordinates and attempt: :func:`redrive.headers.request_id`); for one that
    names no original record, or could not be read, where it was read from.
    """
    if request is None:
        return read_at_identity(coordinates)
    if request.id is not None:
        return bytes.fromhex(request.id)
    return failure_identity(
        request.group,
        request.original_topic,
        request.original_partition,
        request.original_offset,
        request.attempt,
        coordinates,
        release=request.order == "release",
    )


def failure_identity(
    group: str | None,
    topic: str | None,
    partition: int | None,
    offset: int | None,
    attempt: int,
    coordinates: RequestCoordinates,
    *,
    release: bool = False,
) -> bytes:
    """:func:`identity` from a request's fields (a stored row's columns, say)."""
    if topic is None or offset is None:
        return read_at_identity(coordinates)
    return bytes.fromhex(failure_id(group, topic, partition, offset, attempt, release=release))


def read_at_identity(coordinates: RequestCoordinates) -> bytes:
    """The identity of a request named by nothing it says: where it was read (a refused
    request, a forgery, one whose headers cannot be read). Read again, it is the same.

    The digest of ``["request",<topic>,<partition>,<offset>]`` as compact JSON (stored
    identities are of that text: it must not change); the topic's part is encoded once
    per topic, since ``json.dumps`` of the whole list was the costliest step of taking
    an identity for each request intake reads."""
    topic, partition, offset = coordinates
    where = b"%s,%d,%d]" % (_read_at_prefix(topic), partition, offset)
    return hashlib.blake2b(where, digest_size=16).digest()


@lru_cache(maxsize=1024)
def _read_at_prefix(topic: str) -> bytes:
    return json.dumps(["request", topic], separators=(",", ":")).encode()[:-1]


def _order_problem(request: RetryHeaders, rules: IntakeRules) -> str | None:
    """Why a request of a key's queue cannot be kept in order, if it cannot."""
    if not rules.keeps_order:
        return (
            f"redrive-order: {request.order} needs the retry service, which keeps each "
            "key's queue (this scheduler does not)"
        )
    missing = [
        name
        for name, value in (
            (GROUP, request.group),
            (ORIGINAL_TOPIC, request.original_topic),
            (ORIGINAL_PARTITION, request.original_partition),
            (ORIGINAL_OFFSET, request.original_offset),
        )
        if value is None
    ]
    if missing:
        names = ", ".join(missing)
        return f"redrive-order: {request.order} must name its key's queue; missing {names}"
    return None


def _text(raw: bytes | None) -> str | None:
    """A header value as text for the dead-letter columns, whatever its bytes."""
    return None if raw is None else raw.decode("utf-8", "replace")


def _dead(
    msg: Incoming,
    request: RetryHeaders | None,
    code: DeadLetterReason,
    reason: str,
    claimed: bytes | None = None,
    content: bytes | None = None,
) -> DeadLetterRecord:
    """A dead letter keeping the request whole: raw headers, key, value, coordinates.

    Its identity is ``claimed`` (the request's, once accepted or vouched for), else one
    of its own: where it was read, which a forgery cannot take from another request.
    When the headers could not be decoded, the columns are filled from what is
    readable, so that operators can still search the letter by topic or error.
    """
    # What every dead letter of intake keeps: the request as it came, and why.
    letter = partial(
        DeadLetterRecord,
        key=msg.key,
        value=msg.value,
        headers=msg.headers,
        reason_code=code,
        reason=reason,
        source=SOURCE,
        request=msg.coordinates,
        identity=claimed if claimed is not None else read_at_identity(msg.coordinates),
        content=content,
    )
    if request is not None:
        return letter(
            topic=request.destination, attempt=request.attempt, **request.failure_history()
        )
    raw, _ = split_headers(msg.headers)
    return letter(
        topic=(_text(raw.get(DESTINATION)) or "")[:MAX_TOPIC_LENGTH] or None,
        group=(_text(raw.get(GROUP)) or "")[:MAX_VALUE_BYTES] or None,
        error_type=(_text(raw.get(ERROR_TYPE)) or "")[:MAX_VALUE_BYTES] or None,
        error_message=(_text(raw.get(ERROR_MESSAGE)) or "")[:MAX_ERROR_MESSAGE_BYTES] or None,
    )
