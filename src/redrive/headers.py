"""The redrive header contract (DESIGN section 2), as pure functions on header lists.

Everything redrive knows about a message in flight travels in Kafka headers named
``redrive-*``, next to the user's own headers, which are never touched. This module is
the only place that turns those headers into values and back, so that every producer
and consumer of a retry request (library, retry service, Spark pipeline) agrees on one
format. It never talks to Kafka: it works on the header lists confluent-kafka uses,
``list[tuple[str, bytes | None]]``.

Wire format: every value is a UTF-8 string, times are epoch milliseconds, integers are
plain decimal digits. Every value has a size cap (see ``MAX_*``) so that headers never
grow with the number of attempts and a forged request cannot carry megabytes of text.

- :func:`encode` / :func:`decode` write and strictly validate a retry request.
- :func:`read_delivery_headers` is the lenient reader a consumer uses on a redelivered
  message to learn its attempt count and original coordinates.
- :func:`next_request` builds the request a consumer writes after a failure.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any, Final, Literal, NamedTuple, TypeAlias

Header: TypeAlias = tuple[str, bytes | None]
"""One Kafka header as confluent-kafka returns it: name and raw value (or None)."""

SendTo: TypeAlias = Literal["retry", "dlq"]

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
DEAD_LETTER_REASON: Final = "redrive-dead-letter-reason"
"""Not part of a request: added to a dead letter published to a DLQ topic (by the
retry service's ``mirror_dead_letters`` and the Spark scheduler), saying why it is
one. Never read from a request, so not in :data:`ALL_HEADERS`."""

# Header name -> RetryHeaders field, in the order encode() writes them.
_FIELD_OF: Final[dict[str, str]] = {
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
}

ALL_HEADERS: Final[tuple[str, ...]] = tuple(_FIELD_OF)
"""Every header of the contract, in the order :func:`encode` writes them."""

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
_INT_HEADERS: Final[frozenset[str]] = frozenset(
    {
        PARTITION,
        RETRY_AT,
        ATTEMPT,
        DEADLINE,
        ORIGINAL_PARTITION,
        ORIGINAL_OFFSET,
        ORIGINAL_TIMESTAMP,
    }
)
_TOPIC_RE: Final = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_DIGITS_RE: Final = re.compile(r"[0-9]+")
_NEGATIVE_RE: Final = re.compile(r"-[0-9]+")


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


def _show(value: object, limit: int = 60) -> str:
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
            f"not a valid Kafka topic name: {_show(value)} "
            f"(1..{MAX_TOPIC_LENGTH} characters of a-z A-Z 0-9 . _ -, not '.' or '..')",
        )


def _check_int(header: str, value: object, minimum: int, maximum: int) -> None:
    if type(value) is not int:  # bool and float are mistakes (e.g. time.time() * 1000)
        raise HeaderError(header, f"must be an int, got {type(value).__name__} {_show(value)}")
    if value < minimum:
        raise HeaderError(header, f"must be >= {minimum}, got {value}")
    if value > maximum:
        raise HeaderError(header, f"out of range (max {maximum}), got {value}")


def _check_text(header: str, value: object) -> None:
    value = _require_str(header, value)
    if not value:
        raise HeaderError(header, "empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise HeaderError(header, f"not encodable as UTF-8: {_show(value)}") from None
    if size > MAX_VALUE_BYTES:
        raise HeaderError(header, f"too long: {size} bytes (max {MAX_VALUE_BYTES})")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryHeaders:
    """The redrive headers of one retry request, as typed values.

    Constructing one validates it (raising :class:`HeaderError` that names the header),
    and caps the error texts, so an instance is always exactly what goes on the wire:
    ``decode(encode(h))[0] == h``.
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
    """Message of the latest failure, at most :data:`MAX_ERROR_MESSAGE_BYTES`."""
    error_trace: str | None = None
    """Stack trace of the latest failure, at most :data:`MAX_ERROR_TRACE_BYTES`."""
    reason: str | None = None
    """Why the consumer gave up (with ``send_to="dlq"``), at most 1 KiB, e.g.
    ``attempts exhausted (3 of 3)``."""

    def __post_init__(self) -> None:
        # decode() skips these checks for what it has read (see _FAST_RULES, which
        # restates them): change both together.
        _check_topic(DESTINATION, self.destination)
        _check_int(RETRY_AT, self.retry_at, 0, MAX_INT64)
        _check_int(ATTEMPT, self.attempt, 1, MAX_INT32)
        if self.send_to not in ("retry", "dlq"):
            raise HeaderError(SEND_TO, f"must be 'retry' or 'dlq', got {_show(self.send_to)}")
        for header, value, maximum in (
            (PARTITION, self.partition, MAX_INT32),
            (DEADLINE, self.deadline, MAX_INT64),
            (ORIGINAL_PARTITION, self.original_partition, MAX_INT32),
            (ORIGINAL_OFFSET, self.original_offset, MAX_INT64),
            (ORIGINAL_TIMESTAMP, self.original_timestamp, MAX_INT64),
        ):
            if value is not None:
                _check_int(header, value, 0, maximum)
        if self.original_topic is not None:
            _check_topic(ORIGINAL_TOPIC, self.original_topic)
        for header, text in ((GROUP, self.group), (ERROR_TYPE, self.error_type)):
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


def split_headers(
    headers: Iterable[Header] | None,
) -> tuple[dict[str, bytes | None], list[Header]]:
    """Split headers into redrive ones (name -> value) and the user's (order kept).

    No validation: for a repeated redrive header the last one wins, as with Kafka's
    ``lastHeader``. Use :func:`decode` to validate. ``None`` (what confluent-kafka
    returns for a message without headers) is an empty list.
    """
    redrive: dict[str, bytes | None] = {}
    user: list[Header] = []
    for name, value in headers or ():
        if is_redrive_header(name):
            redrive[name] = value
        else:
            user.append((name, value))
    return redrive, user


def encode(h: RetryHeaders, user_headers: Iterable[Header] | None = None) -> list[Header]:
    """Headers for a retry request: the user's headers, then the redrive headers.

    User headers pass through byte for byte, in order, except any ``redrive-*`` ones
    among them, which are dropped so the request carries exactly one of each (passing
    a redelivered message's whole header list is therefore fine). Absent optional
    fields are omitted.
    """
    out: list[Header] = [(n, v) for n, v in user_headers or () if not is_redrive_header(n)]
    for header, field_name in _FIELD_OF.items():
        value = getattr(h, field_name)
        if value is None:
            continue
        text = str(value) if isinstance(value, int) else value
        out.append((header, text.encode("utf-8", "replace")))
    return out


def _as_pairs(headers: Iterable[Header] | None) -> list[tuple[int, str, object]]:
    """(index, name, value) for each header; HeaderError when the list is malformed."""
    if headers is None:
        return []
    if isinstance(headers, str | bytes | dict):
        kind = type(headers).__name__
        raise HeaderError(None, f"headers must be a list of (name, value) pairs, got {kind}")
    try:
        items = list(headers)
    except TypeError:
        raise HeaderError(None, f"headers are not iterable: {type(headers).__name__}") from None
    pairs: list[tuple[int, str, object]] = []
    for index, item in enumerate(items):
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise HeaderError(None, f"header {index} is not a (name, value) pair: {_show(item)}")
        name, value = item
        if not isinstance(name, str):
            raise HeaderError(None, f"header {index} has a non-str name: {_show(name)}")
        pairs.append((index, name, value))
    return pairs


def _decode_value(header: str, value: object) -> str:
    """Validate size and UTF-8 of one raw redrive header value."""
    if value is None:
        raise HeaderError(header, "value is null")
    if not isinstance(value, bytes | bytearray | memoryview):
        raise HeaderError(header, f"value must be bytes, got {type(value).__name__}")
    raw = bytes(value)
    cap = _CAPS.get(header, MAX_VALUE_BYTES)
    if len(raw) > cap:
        raise HeaderError(header, f"too long: {len(raw)} bytes (max {cap})")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HeaderError(header, f"not valid UTF-8: {_show(raw)}") from None


def _parse_int(header: str, text: str) -> int:
    if _DIGITS_RE.fullmatch(text):
        return int(text)
    if _NEGATIVE_RE.fullmatch(text):
        raise HeaderError(header, f"must not be negative: {_show(text)}")
    raise HeaderError(header, f"not a decimal integer: {_show(text)}")


def _field_values(header: str, text: str) -> object:
    return _parse_int(header, text) if header in _INT_HEADERS else text


def decode(headers: Iterable[Header] | None) -> tuple[RetryHeaders, list[Header]]:
    """Strictly read a retry request: its redrive headers and the user's headers.

    Raises :class:`HeaderError` (and nothing else, whatever the input) when a required
    header is missing, a ``redrive-*`` header is unknown (a typo), repeated or null,
    a value is not UTF-8, too long, not a decimal integer, out of range, or not a legal
    topic name. The user's headers come back untouched, in order.
    """
    # Every request consumed by the retry service comes through here, almost always as
    # confluent-kafka's list of (str, bytes) tuples carrying a valid request: read that
    # in one pass. Anything else, and any problem at all, goes the careful way, which
    # alone decides which error to raise (and in which order problems are found).
    if type(headers) is list:
        fast = _decode_fast(headers)
        if fast is not None:
            return fast
    return _decode_checked(headers)


def _decode_checked(headers: Iterable[Header] | None) -> tuple[RetryHeaders, list[Header]]:
    """:func:`decode` one check at a time: the reference for every error and result."""
    values: dict[str, object] = {}
    user: list[Header] = []
    for _, name, value in _as_pairs(headers):
        if not is_redrive_header(name):
            user.append((name, value))  # type: ignore[arg-type]  # passed through as given
            continue
        if name not in _FIELD_OF:
            raise HeaderError(name, "unknown redrive header (misspelt?)")
        if _FIELD_OF[name] in values:
            raise HeaderError(name, "appears more than once")
        values[_FIELD_OF[name]] = _field_values(name, _decode_value(name, value))
    for header in REQUIRED_HEADERS:
        if _FIELD_OF[header] not in values:
            raise HeaderError(header, "missing (required in a retry request)")
    return RetryHeaders(**values), user  # type: ignore[arg-type]  # validated in __post_init__


# What _decode_fast asks of each header's raw value, by kind. Together with the byte cap
# of _decode_value, each is everything _decode_value, _parse_int and
# RetryHeaders.__post_init__ ask of such a header, so a value meeting it is one the
# careful path accepts and turns into the same field value.
_INT: Final = 0  # ASCII decimal digits, and minimum <= the number <= maximum
_TOPIC: Final = 1  # a legal Kafka topic name (ASCII, so its bytes can be checked)
_SEND_TO: Final = 2  # b"retry" or b"dlq"
_TEXT: Final = 3  # non-empty UTF-8 (group, error type); the byte cap is _check_text's
_ANY_TEXT: Final = 4  # UTF-8, maybe empty; within its cap, so cap_text leaves it as it is
_Rule: TypeAlias = tuple[str, int, int, int, int]


def _rule(header: str, kind: int, minimum: int = 0, maximum: int = 0) -> _Rule:
    # Field and cap come from the tables the careful path uses, so they cannot drift.
    return (_FIELD_OF[header], kind, _CAPS.get(header, MAX_VALUE_BYTES), minimum, maximum)


# header -> (field, kind, byte cap, minimum, maximum); ranges as in __post_init__.
_FAST_RULES: Final[dict[str, _Rule]] = {
    DESTINATION: _rule(DESTINATION, _TOPIC),
    PARTITION: _rule(PARTITION, _INT, 0, MAX_INT32),
    RETRY_AT: _rule(RETRY_AT, _INT, 0, MAX_INT64),
    ATTEMPT: _rule(ATTEMPT, _INT, 1, MAX_INT32),
    DEADLINE: _rule(DEADLINE, _INT, 0, MAX_INT64),
    SEND_TO: _rule(SEND_TO, _SEND_TO),
    GROUP: _rule(GROUP, _TEXT),
    ORIGINAL_TOPIC: _rule(ORIGINAL_TOPIC, _TOPIC),
    ORIGINAL_PARTITION: _rule(ORIGINAL_PARTITION, _INT, 0, MAX_INT32),
    ORIGINAL_OFFSET: _rule(ORIGINAL_OFFSET, _INT, 0, MAX_INT64),
    ORIGINAL_TIMESTAMP: _rule(ORIGINAL_TIMESTAMP, _INT, 0, MAX_INT64),
    ERROR_TYPE: _rule(ERROR_TYPE, _TEXT),
    ERROR_MESSAGE: _rule(ERROR_MESSAGE, _ANY_TEXT),
    ERROR_TRACE: _rule(ERROR_TRACE, _ANY_TEXT),
    REASON: _rule(REASON, _ANY_TEXT),
}
_TOPIC_BYTES: Final = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
"""The characters of _TOPIC_RE: bytes made only of them strip to nothing."""


def _is_topic(raw: bytes) -> bool:
    """_check_topic's test on a topic name's bytes (a few times faster than _TOPIC_RE)."""
    return (
        0 < len(raw) <= MAX_TOPIC_LENGTH
        and not raw.strip(_TOPIC_BYTES)
        and raw not in (b".", b"..")
    )


# (slot setter, field, default) for each RetryHeaders field. _decode_fast fills a new
# instance through these (slot descriptors, which the frozen __setattr__ does not guard)
# rather than calling RetryHeaders(...), whose __post_init__ would check again all that
# _decode_fast has just checked: that was a third of decode's time.
_SLOTS: Final[tuple[tuple[Any, str, object], ...]] = tuple(
    (getattr(RetryHeaders, f.name).__set__, f.name, f.default) for f in fields(RetryHeaders)
)


def _decode_fast(headers: list[Any]) -> tuple[RetryHeaders, list[Header]] | None:
    """:func:`decode` of a valid request in one pass; None when anything is amiss."""
    values: dict[str, object] = {}
    user: list[Header] = []
    for item in headers:
        # Exact types only: a subclass (of tuple, str or bytes) could run its own code
        # when unpacked, hashed, compared or decoded, and so behave other than checked.
        if type(item) is not tuple:
            return None
        try:
            name, raw = item
        except ValueError:  # not a pair
            return None
        if type(name) is not str:
            return None
        rule = _FAST_RULES.get(name)
        if rule is None:
            if is_redrive_header(name):
                return None  # unknown
            user.append(item)  # already an immutable (name, value) pair
            continue
        field, kind, cap, minimum, maximum = rule
        if field in values or type(raw) is not bytes or len(raw) > cap:
            return None  # repeated, null, not bytes or too long
        if kind == _INT:
            # bytes.isdigit() means ASCII 0-9 only, as _DIGITS_RE (str.isdigit() would
            # also take other scripts' digits and superscripts), and int() reads those
            # bytes as _parse_int reads their text.
            if not raw.isdigit():
                return None
            number = int(raw)
            if not minimum <= number <= maximum:
                return None
            values[field] = number
            continue
        if kind == _TOPIC and not _is_topic(raw):
            return None
        if kind == _SEND_TO and raw not in (b"retry", b"dlq"):
            return None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if kind == _TEXT and not text:
            return None
        values[field] = text
    if "destination" not in values or "retry_at" not in values:
        return None  # a REQUIRED_HEADERS one is missing
    request = object.__new__(RetryHeaders)
    for set_slot, field, default in _SLOTS:
        set_slot(request, values.get(field, default))
    return request, user


def read_delivery_headers(headers: Iterable[Header] | None) -> RetryHeaders | None:
    """Leniently read the redrive headers of a message delivered back by redrive.

    A consumer calls this on every message to learn whether it is a redelivery, its
    attempt count and original coordinates. It never raises: unknown ``redrive-*``
    headers are ignored, a repeated header's last value wins, an invalid optional value
    is dropped (an invalid attempt counts as 1), oversized error texts are capped.
    Returns None for a first delivery, or when destination or retry-at is unusable.
    """
    try:
        pairs = _as_pairs(headers)
    except HeaderError:
        return None
    values: dict[str, object] = {}
    for _, name, value in pairs:
        field_name = _FIELD_OF.get(name)
        if field_name is None or not isinstance(value, bytes | bytearray | memoryview):
            continue
        try:
            text = bytes(value).decode("utf-8")
            values[field_name] = _field_values(name, text)
        except (UnicodeDecodeError, HeaderError):
            values.pop(field_name, None)
    if any(_FIELD_OF[h] not in values for h in REQUIRED_HEADERS):
        return None
    while True:  # drop invalid fields one at a time until the rest is valid
        try:
            return RetryHeaders(**values)  # type: ignore[arg-type]
        except HeaderError as error:
            field_name = _FIELD_OF.get(error.header or "")
            if field_name is None or error.header in REQUIRED_HEADERS:
                return None
            values.pop(field_name, None)


class ErrorInfo(NamedTuple):
    """A failure as the ``redrive-error-*`` headers describe it."""

    type: str
    message: str
    trace: str


def qualified_name(cls: type) -> str:
    """``module.QualName`` of a class; builtins without module (``ValueError``)."""
    module = getattr(cls, "__module__", None)
    name = getattr(cls, "__qualname__", cls.__name__)
    return name if module in (None, "builtins") else f"{module}.{name}"


def describe_error(error: BaseException) -> ErrorInfo:
    """Type, message and formatted stack trace of an exception, capped to the contract."""
    try:
        message = str(error)
    except Exception:  # noqa: BLE001  # a broken __str__ must not hide the failure
        message = f"<unprintable {type(error).__name__}>"
    trace = "".join(traceback.format_exception(error))
    return ErrorInfo(
        cap_text(qualified_name(type(error)), MAX_VALUE_BYTES),
        cap_text(message, MAX_ERROR_MESSAGE_BYTES),
        cap_text(trace, MAX_ERROR_TRACE_BYTES, keep="end"),
    )


def _origin_of(h: RetryHeaders) -> tuple[str | None, int | None, int | None, int | None]:
    return (h.original_topic, h.original_partition, h.original_offset, h.original_timestamp)


def next_request(
    previous: RetryHeaders | None,
    *,
    destination: str,
    retry_at: int,
    error: BaseException | ErrorInfo | tuple[str, str, str],
    record_topic: str | None = None,
    record_partition: int | None = None,
    record_offset: int | None = None,
    record_timestamp: int | None = None,
    deadline: int | None = None,
    group: str | None = None,
    partition: int | None = None,
    send_to: SendTo = "retry",
    attempt: int | None = None,
    reason: str | None = None,
) -> RetryHeaders:
    """The retry request a consumer writes after its handler failed on a message.

    ``previous`` is what :func:`read_delivery_headers` found on the message (None for a
    first delivery). The attempt becomes ``previous.attempt + 1`` (or 1); the original-*
    coordinates are copied from ``previous`` when it has any, otherwise taken from the
    record being handled (``record_*``), so they always name the first consumption; the
    error-* fields are replaced by ``error``. ``deadline`` and ``group`` default to the
    previous request's. ``partition`` is the destination partition (None: by key).
    ``attempt`` overrides the count when the caller knows better (a record retried in
    place carries no previous request); ``reason`` says why a dead letter gave up.
    """
    if isinstance(error, BaseException):
        info = describe_error(error)
    else:
        error_type, message, trace = error
        info = ErrorInfo(cap_text(error_type, MAX_VALUE_BYTES), message, trace)
    origin = (record_topic, record_partition, record_offset, record_timestamp)
    if previous is not None and any(v is not None for v in _origin_of(previous)):
        origin = _origin_of(previous)
    return RetryHeaders(
        destination=destination,
        retry_at=retry_at,
        attempt=attempt if attempt is not None else (previous.attempt + 1 if previous else 1),
        partition=partition,
        deadline=deadline if deadline is not None or previous is None else previous.deadline,
        send_to=send_to,
        group=group if group is not None or previous is None else previous.group,
        original_topic=origin[0],
        original_partition=origin[1],
        original_offset=origin[2],
        original_timestamp=origin[3],
        error_type=info.type or None,
        error_message=info.message,
        error_trace=info.trace,
        reason=reason,
    )
