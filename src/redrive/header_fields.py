"""The redrive headers one by one: their names, caps and ranges, and :class:`RetryHeaders`,
the typed retry request that enforces them.

This is the data half of the header contract (``docs/headers.md``): what each
``redrive-*`` header is called, which :class:`RetryHeaders` field it fills, how large
its value may be and which values are legal. Constructing a :class:`RetryHeaders`
checks all of that, so an instance is always a request that can go on the wire. How
headers are read off a record is :mod:`redrive.header_decoding`'s business, how they
are written :mod:`redrive.headers`'s; everyone else imports these names from
:mod:`redrive.headers`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any, Final, Literal, TypeAlias

Header: TypeAlias = tuple[str, bytes | None]
"""One Kafka header as confluent-kafka returns it: name and raw value (or None)."""

SendTo: TypeAlias = Literal["retry", "dlq"]
Order: TypeAlias = Literal["key", "behind", "release"]
"""``redrive-order``: what a request is to its key's queue (see :class:`RetryHeaders`)."""
ORDERS: Final[tuple[Order, ...]] = ("key", "behind", "release")
GiveUp: TypeAlias = Literal[
    "fatal_error", "attempts_exhausted", "deadline_passed", "invalid_signature"
]
GIVE_UPS: Final[tuple[GiveUp, ...]] = (
    "fatal_error",
    "attempts_exhausted",
    "deadline_passed",
    "invalid_signature",
)
"""Why a consumer gave up on a record, as ``redrive-reason-code`` says it: the reason
codes of :class:`redrive.reasons.DeadLetterReason` a policy decides, and
``invalid_signature`` for a return the consumer refused (its redrive headers not
believed: :mod:`redrive.returns`), which its receiver counts as a refusal."""

REDRIVE_PREFIX: Final = "redrive-"

DESTINATION: Final = "redrive-destination"
PARTITION: Final = "redrive-partition"
RETRY_AT: Final = "redrive-retry-at"
ATTEMPT: Final = "redrive-attempt"
DEADLINE: Final = "redrive-deadline"
SEND_TO: Final = "redrive-send-to"
GROUP: Final = "redrive-group"
ORIGINAL_TOPIC: Final = "redrive-original-topic"
ORIGINAL_PARTITION: Final = "redrive-original-partition"
ORIGINAL_OFFSET: Final = "redrive-original-offset"
ORIGINAL_TIMESTAMP: Final = "redrive-original-timestamp"
ERROR_TYPE: Final = "redrive-error-type"
ERROR_MESSAGE: Final = "redrive-error-message"
ERROR_TRACE: Final = "redrive-error-trace"
REASON: Final = "redrive-reason"
REASON_CODE: Final = "redrive-reason-code"
ID: Final = "redrive-id"
ORDER: Final = "redrive-order"
REPLAYS: Final = "redrive-replays"
REPLAY_OF: Final = "redrive-replay-of"
SIGNATURE: Final = "redrive-signature"
"""The sender's signature of the request (:mod:`redrive.signing`): an HMAC over the
other redrive headers, the key and the value's digest. Checked by the receiver of the
requests topic; never kept by a delivery's reader (:func:`read_delivery_headers`), so a
request written again from a delivery is signed again or not at all."""
DEAD_LETTER_REASON: Final = "redrive-dead-letter-reason"
"""Not part of a request: added to a dead letter published to a DLQ topic (by the
retry service's ``mirror_dead_letters`` and the Spark scheduler), saying why it is
one. Never read from a request, so not in :data:`ALL_HEADERS`."""
RUN: Final = "redrive-run"
"""Not part of a request: added by the retry service to each record of a key's queue it
delivers, naming the run it delivered them in (the records of one key released
together, :mod:`redrive.service.store.key_queues`). A consumer that fails on one of a
run drops the rest of that run, which the service then holds again behind the failed
record (:mod:`redrive.consumer.key_order_service`). Never read from a request, so not
in :data:`ALL_HEADERS`."""

FIELD_OF: Final[dict[str, str]] = {
    DESTINATION: "destination",
    PARTITION: "partition",
    RETRY_AT: "retry_at",
    ATTEMPT: "attempt",
    DEADLINE: "deadline",
    SEND_TO: "send_to",
    GROUP: "group",
    ORIGINAL_TOPIC: "original_topic",
    ORIGINAL_PARTITION: "original_partition",
    ORIGINAL_OFFSET: "original_offset",
    ORIGINAL_TIMESTAMP: "original_timestamp",
    ERROR_TYPE: "error_type",
    ERROR_MESSAGE: "error_message",
    ERROR_TRACE: "error_trace",
    REASON: "reason",
    REASON_CODE: "reason_code",
    ID: "id",
    ORDER: "order",
    REPLAYS: "replays",
    REPLAY_OF: "replay_of",
    SIGNATURE: "signature",
}
"""Header name -> :class:`RetryHeaders` field, in the order ``encode()`` writes them."""

ALL_HEADERS: Final[tuple[str, ...]] = tuple(FIELD_OF)
"""Every header of the contract, in the order :func:`redrive.headers.encode` writes them."""

REQUIRED_HEADERS: Final[tuple[str, ...]] = (DESTINATION, RETRY_AT)

MAX_ERROR_MESSAGE_BYTES: Final = 1024
"""Cap on ``redrive-error-message`` (UTF-8 bytes); longer messages keep their start."""
MAX_ERROR_TRACE_BYTES: Final = 8 * 1024
"""Cap on ``redrive-error-trace`` (UTF-8 bytes); longer traces keep their end."""
MAX_VALUE_BYTES: Final = 1024
"""Cap on every other redrive header value (UTF-8 bytes)."""
MAX_TOPIC_LENGTH: Final = 249
"""Kafka's own limit on topic names."""

MAX_INT64: Final = 2**63 - 1
"""Largest time, offset or deadline (Kafka and PostgreSQL use signed 64-bit integers)."""
MAX_INT32: Final = 2**31 - 1
"""Largest partition number or attempt count (Kafka partitions are signed 32-bit)."""

TRUNCATED_SUFFIX: Final = " ...[truncated]"
"""Appended to an error message that was cut to fit its cap."""
TRUNCATED_PREFIX: Final = "[truncated]... "
"""Put in front of a stack trace whose beginning was cut to fit its cap."""

_CAPS: Final[dict[str, int]] = {
    ERROR_MESSAGE: MAX_ERROR_MESSAGE_BYTES,
    REASON: MAX_ERROR_MESSAGE_BYTES,
    ERROR_TRACE: MAX_ERROR_TRACE_BYTES,
}

INT_HEADERS: Final[frozenset[str]] = frozenset(
    {
        PARTITION,
        RETRY_AT,
        ATTEMPT,
        DEADLINE,
        ORIGINAL_PARTITION,
        ORIGINAL_OFFSET,
        ORIGINAL_TIMESTAMP,
        REPLAYS,
        REPLAY_OF,
    }
)
"""The headers whose values are decimal integers."""
_TOPIC_RE: Final = re.compile(r"[a-zA-Z0-9._-]{1,249}")
ID_LENGTH: Final = 32
"""Characters of a ``redrive-id``: 16 bytes of digest as lowercase hex."""
_ID_RE: Final = re.compile(rf"[0-9a-f]{{{ID_LENGTH}}}")


def cap_of(header: str) -> int:
    """Most UTF-8 bytes a value of ``header`` may have on the wire."""
    return _CAPS.get(header, MAX_VALUE_BYTES)


class HeaderError(ValueError):
    """A redrive header is missing, malformed or not allowed.

    ``header`` names the offending header (None when the problem is the header list
    itself) and ``problem`` says what is wrong, so that a retry request rejected by the
    service becomes a dead letter whose reason an operator can act on.
    """

    def __init__(self, header: str | None, problem: str) -> None:
        self.header = header
        self.problem = problem
        super().__init__(f"{header}: {problem}" if header else problem)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep both attributes when pickled (Spark ships exceptions between processes).
        return (type(self), (self.header, self.problem))


def show_value(value: object, limit: int = 60) -> str:
    """Quote a bad value for an error message without echoing kilobytes of it."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cap_text(text: str, max_bytes: int, *, keep: Literal["start", "end"] = "start") -> str:
    """Return ``text`` cut to at most ``max_bytes`` UTF-8 bytes, marked when cut.

    Cuts on a character boundary. ``keep="start"`` keeps the beginning and appends
    :data:`TRUNCATED_SUFFIX` (for messages); ``keep="end"`` keeps the end, where the
    failing frame of a stack trace is, behind :data:`TRUNCATED_PREFIX`. Characters that
    cannot be encoded (lone surrogates) become ``?``. Idempotent: capping a capped
    text changes nothing, which is why headers do not grow with attempts.
    """
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return data.decode("utf-8")
    marker = TRUNCATED_SUFFIX if keep == "start" else TRUNCATED_PREFIX
    budget = max_bytes - len(marker.encode("utf-8"))
    if budget < 0:  # a cap too small for the marker: cut without marking
        marker, budget = "", max_bytes
    if keep == "start":
        return data[:budget].decode("utf-8", "ignore") + marker
    return marker + data[len(data) - budget :].decode("utf-8", "ignore")


def _require_str(header: str, value: object) -> str:
    if not isinstance(value, str):
        raise HeaderError(header, f"must be a str, got {type(value).__name__}")
    return value


def is_topic_name(name: str) -> bool:
    """True if `name` is a legal Kafka topic name (the rule under every topic check)."""
    return name not in (".", "..") and _TOPIC_RE.fullmatch(name) is not None


def _check_topic(header: str, value: object) -> None:
    value = _require_str(header, value)
    if not is_topic_name(value):
        raise HeaderError(
            header,
            f"not a valid Kafka topic name: {show_value(value)} "
            f"(1..{MAX_TOPIC_LENGTH} characters of a-z A-Z 0-9 . _ -, not '.' or '..')",
        )


def _check_int(header: str, value: object, minimum: int, maximum: int) -> None:
    if type(value) is not int:  # bool and float are mistakes (e.g. time.time() * 1000)
        raise HeaderError(header, f"must be an int, got {type(value).__name__} {show_value(value)}")
    if value < minimum:
        raise HeaderError(header, f"must be >= {minimum}, got {value}")
    if value > maximum:
        raise HeaderError(header, f"out of range (max {maximum}), got {value}")


def _check_id(value: object) -> None:
    # One exact form, so that two ids of the same request compare equal as bytes and
    # nothing else (a name, a number) passes for one.
    value = _require_str(ID, value)
    if _ID_RE.fullmatch(value) is None:
        raise HeaderError(
            ID, f"must be {ID_LENGTH} lowercase hex characters (0-9 a-f), got {show_value(value)}"
        )


def _check_text(header: str, value: object) -> None:
    value = _require_str(header, value)
    if not value:
        raise HeaderError(header, "empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise HeaderError(header, f"not encodable as UTF-8: {show_value(value)}") from None
    if size > MAX_VALUE_BYTES:
        raise HeaderError(header, f"too long: {size} bytes (max {MAX_VALUE_BYTES})")


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureHistory:
    """What a message's failures left on it: who failed, where it began, the last error.

    A retry request carries these (:class:`RetryHeaders`, which validates and caps
    them) and a dead letter keeps them (:class:`redrive.records.DeadLetterRecord`), so
    they are declared once, here.
    """

    group: str | None = None
    """Consumer group that failed on it."""
    original_topic: str | None = None
    original_partition: int | None = None
    original_offset: int | None = None
    original_timestamp: int | None = None
    """Where and when the message was first consumed; kept across attempts."""
    error_type: str | None = None
    """Qualified exception name of the latest failure, e.g. ``json.decoder.JSONDecodeError``."""
    error_message: str | None = None
    """Message of the latest failure, at most :data:`MAX_ERROR_MESSAGE_BYTES` in a request."""
    error_trace: str | None = None
    """Stack trace of the latest failure, at most :data:`MAX_ERROR_TRACE_BYTES` in a request."""
    replays: int | None = None
    """How many times the message was replayed from the retry service's dead letters
    (1 for a replay of a letter that had never been replayed); None: never replayed.
    Carried through retries into its next dead letter, so that the service counts
    the rounds (its loop guard)."""
    replay_of: int | None = None
    """The id of the dead letter the message was last replayed from (with ``replays``)."""

    def failure_history(self) -> dict[str, Any]:
        """These fields alone, as keyword arguments (for a dead letter made of a
        request, or of another system's metadata)."""
        return {f.name: getattr(self, f.name) for f in fields(FailureHistory)}


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryHeaders(FailureHistory):
    """The redrive headers of one retry request, as typed values.

    Constructing one validates it (raising :class:`HeaderError` that names the header),
    and caps the error texts, so an instance is always exactly what goes on the wire:
    ``decode(encode(h))[0] == h``. Its group, original-* and error-* fields are those
    of :class:`FailureHistory`.
    """

    destination: str
    """Topic to deliver the message to when due."""
    retry_at: int
    """When it is due, epoch ms."""
    attempt: int = 1
    """Failed attempts so far, 1 after the first failure."""
    partition: int | None = None
    """Partition to deliver to; None: partitioned by key."""
    deadline: int | None = None
    """Epoch ms after which it goes to the dead letters instead of back."""
    send_to: SendTo = "retry"
    reason: str | None = None
    """Why the consumer gave up (with ``send_to="dlq"``), at most 1 KiB, e.g.
    ``attempts exhausted (3 of 3)``."""
    id: str | None = None
    """The request's identity, the same on every delivery of it: ``ID_LENGTH`` lowercase
    hex characters (:func:`redrive.headers.request_id`). None in requests written
    before redrive wrote one, or by a producer that writes none."""
    order: Order | None = None
    """The record's key keeps its order through the retry (``ordering="key"``): ``key``,
    a retry of the record at the head of its key's queue; ``behind``, a record not
    handled yet that waits behind that head (its attempt is 0: it has not failed);
    ``release``, not a retry: the consumer is done with the head this request names
    (its original offset and attempt), the next of the queue may go. The queue is
    the group's, original topic's and partition's, and the record key's. None: no
    order kept (the record's key may be overtaken)."""
    reason_code: GiveUp | None = None
    """Why the consumer gave up, for machines (with ``send_to="dlq"`` only): a fatal
    error, its attempts or its deadline spent, or a return it refused. The retry
    service stores it as the dead letter's reason code; None (a sender that writes
    none): ``sent_to_dlq``."""
    signature: str | None = None
    """``v1:<key id>:<MAC>``, written by a sender that signs (:mod:`redrive.signing`,
    which alone judges it); here only text within its cap. None: unsigned."""

    def __post_init__(self) -> None:
        # decode() skips these checks for what it has read (see _FAST_RULES in
        # header_decoding.py, which restates them): change both together.
        _check_topic(DESTINATION, self.destination)
        _check_int(RETRY_AT, self.retry_at, 0, MAX_INT64)
        if self.order is not None and self.order not in ORDERS:
            raise HeaderError(
                ORDER, f"must be one of {', '.join(ORDERS)}, got {show_value(self.order)}"
            )
        # A record waiting behind its key's head, or released, may not have failed yet.
        unfailed = self.order in ("behind", "release")
        _check_int(ATTEMPT, self.attempt, 0 if unfailed else 1, MAX_INT32)
        if self.send_to not in ("retry", "dlq"):
            raise HeaderError(SEND_TO, f"must be 'retry' or 'dlq', got {show_value(self.send_to)}")
        if self.reason_code is not None:
            if self.reason_code not in GIVE_UPS:
                raise HeaderError(
                    REASON_CODE,
                    f"must be one of {', '.join(GIVE_UPS)}, got {show_value(self.reason_code)}",
                )
            if self.send_to != "dlq":
                raise HeaderError(REASON_CODE, "is for a dead letter (redrive-send-to: dlq)")
        for header, value, maximum in (
            (PARTITION, self.partition, MAX_INT32),
            (DEADLINE, self.deadline, MAX_INT64),
            (ORIGINAL_PARTITION, self.original_partition, MAX_INT32),
            (ORIGINAL_OFFSET, self.original_offset, MAX_INT64),
            (ORIGINAL_TIMESTAMP, self.original_timestamp, MAX_INT64),
            (REPLAYS, self.replays, MAX_INT32),
            (REPLAY_OF, self.replay_of, MAX_INT64),
        ):
            if value is not None:
                _check_int(header, value, 0, maximum)
        if self.original_topic is not None:
            _check_topic(ORIGINAL_TOPIC, self.original_topic)
        if self.id is not None:
            _check_id(self.id)
        for header, text in (
            (GROUP, self.group),
            (ERROR_TYPE, self.error_type),
            (SIGNATURE, self.signature),
        ):
            if text is not None:
                _check_text(header, text)
        # Capped here rather than rejected, so callers can pass str(exc) as it is.
        if self.error_message is not None:
            message = _require_str(ERROR_MESSAGE, self.error_message)
            capped = cap_text(message, MAX_ERROR_MESSAGE_BYTES)
            object.__setattr__(self, "error_message", capped)
        if self.reason is not None:
            reason = _require_str(REASON, self.reason)
            object.__setattr__(self, "reason", cap_text(reason, MAX_ERROR_MESSAGE_BYTES))
        if self.error_trace is not None:
            trace = _require_str(ERROR_TRACE, self.error_trace)
            capped = cap_text(trace, MAX_ERROR_TRACE_BYTES, keep="end")
            object.__setattr__(self, "error_trace", capped)


def is_redrive_header(name: str) -> bool:
    """Whether a header name is in redrive's namespace (case-sensitive prefix)."""
    return name.startswith(REDRIVE_PREFIX)
