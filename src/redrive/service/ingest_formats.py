"""A record of a foreign dead-letter topic, as a redrive dead letter: :func:`ingest`.

Intake reads dead-letter topics written by other systems (the ``ingest`` setting) and
stores each record as a :class:`~redrive.records.DeadLetterRecord`. This module is the
pure mapping, one per format:

- ``spring``: Spring Kafka's ``DeadLetterPublishingRecoverer`` (``kafka_dlt-*`` headers:
  partition a 4-byte and offset and timestamp 8-byte big-endian signed integers, the
  rest UTF-8 text, as its ``DeadLetterRecordManager`` writes them);
- ``connect``: Kafka Connect's ``DeadLetterQueueReporter`` with context headers on
  (``__connect.errors.*``, every value UTF-8 text, numbers in decimal);
- ``redrive``: a ``<topic>.dlq`` record of redrive's own (an App's dead letter, or one
  mirrored by the service or the Spark scheduler), read with the contract's lenient
  reader (:func:`redrive.headers.read_delivery_headers`);
- ``raw``: a record without metadata; ``auto`` picks ``spring`` when any ``kafka_dlt-``
  header is present, else ``connect`` for any ``__connect.errors.`` one, else
  ``redrive`` for any ``redrive-`` one, else ``raw``.

The contract of :func:`ingest`:

- key and value verbatim; headers the record's own minus the format's metadata
  headers, in order and byte for byte, so that a replay delivers the original record;
- ``topic`` (where a replay goes) the original topic the metadata names, when it is a
  legal topic name (redrive: the destination, as intake does for ``sent_to_dlq``);
  None when there is none (raw, or unreadable);
- a value that cannot be read (wrong size, not a number, negative or out of range,
  not UTF-8, not a topic name) is dropped, and the reason says so
  (``; kafka_dlt-original-offset unreadable``); a null value counts as absent;
- a repeated header: the *first* of the original-* headers (topic, partition, offset,
  timestamp and its type, consumer group) counts, the *last* of every other one.
  Spring appends a new set of original-* headers each time a record is dead-lettered
  again (``appendOriginalHeaders``, on by default) and, like Connect, adds the
  current error after any older one: the first original names the first
  consumption (as redrive's original-* do), the last error is the latest failure.
  ``redrive`` follows its contract's reader: the last wins (redrive writes each once);
- ``reason_code`` :attr:`~DeadLetterReason.INGESTED`, except for ``redrive``: the code
  its ``redrive-dead-letter-reason`` names if it is one, else ``sent_to_dlq`` when its
  ``redrive-send-to`` is ``dlq``; ``source`` ``ingest:<format read>``; ``request`` the
  record's own coordinates (the store's unique index on them makes ingest idempotent);
- it never raises, whatever the headers, keys and values.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias, TypeVar

from redrive.header_fields import FIELD_OF, FailureHistory
from redrive.headers import (
    ATTEMPT,
    DEAD_LETTER_REASON,
    DESTINATION,
    MAX_ERROR_MESSAGE_BYTES,
    MAX_ERROR_TRACE_BYTES,
    MAX_INT32,
    MAX_INT64,
    MAX_VALUE_BYTES,
    RETRY_AT,
    SEND_TO,
    Header,
    RetryHeaders,
    cap_text,
    is_redrive_header,
    is_topic_name,
    read_delivery_headers,
)
from redrive.reasons import DeadLetterReason
from redrive.records import DeadLetterRecord
from redrive.requests import Incoming

Format: TypeAlias = Literal["auto", "redrive", "spring", "connect", "raw"]
FORMATS: Final[tuple[Format, ...]] = ("auto", "redrive", "spring", "connect", "raw")
Recognised: TypeAlias = Literal["redrive", "spring", "connect", "raw"]

SPRING_PREFIX: Final = "kafka_dlt-"
CONNECT_PREFIX: Final = "__connect.errors."

_S = SPRING_PREFIX
_C = CONNECT_PREFIX
# The first occurrence of these counts (see the module); of every other, the last.
_ORIGINS: Final = frozenset(
    {
        f"{_S}original-topic",
        f"{_S}original-partition",
        f"{_S}original-offset",
        f"{_S}original-timestamp",
        f"{_S}original-timestamp-type",
        f"{_S}original-consumer-group",
        f"{_C}topic",
        f"{_C}partition",
        f"{_C}offset",
    }
)
_SHORT: Final = 200
"""Most UTF-8 bytes of a name or message quoted in a reason."""
_DECIMAL_RE: Final = re.compile(r"[0-9]{1,19}")  # ASCII digits; 19 hold any int64
_CODES: Final = frozenset(code.value for code in DeadLetterReason)
_NO_TIMESTAMP: Final = -1  # Kafka's "no timestamp", which Spring writes as it is

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class IngestedLetter:
    """A record of a dead-letter topic, read as ``format``, and its dead letter."""

    format: Recognised
    letter: DeadLetterRecord


def ingest(incoming: Incoming, format: Format) -> IngestedLetter:
    """The dead letter a record of a dead-letter topic becomes (see the module).

    ``format`` is one of :data:`FORMATS` (the service's settings check it).
    """
    headers = list(incoming.headers or ())
    read_as = recognise(headers) if format == "auto" else format
    is_meta = _METADATA[read_as]
    meta: list[Header] = []
    user: list[Header] = []
    for item in headers:  # anything else than a named pair is no metadata: kept as is
        (meta if _is_named(item) and is_meta(item[0]) else user).append(item)
    where = f"{incoming.topic}[{incoming.partition}]@{incoming.offset}"
    fields = _READERS[read_as](meta, where)
    reason = fields.reason
    if fields.unreadable:
        reason += "".join(f"; {name} unreadable" for name in fields.unreadable)
    if incoming.header_problem is not None:
        reason += f"; headers partly unreadable: {_short(str(incoming.header_problem))}"
    letter = DeadLetterRecord(
        topic=fields.topic,
        key=incoming.key,
        value=incoming.value,
        headers=user,
        reason_code=fields.code,
        reason=reason,
        source=f"ingest:{read_as}",
        attempt=fields.attempt,
        request=incoming.coordinates,
        **fields.history.failure_history(),
    )
    return IngestedLetter(read_as, letter)


def recognise(headers: Iterable[Header]) -> Recognised:
    """The format ``auto`` reads a record's headers as."""
    names = [item[0] for item in headers if _is_named(item)]
    if any(map(_is_spring, names)):
        return "spring"
    if any(map(_is_connect, names)):
        return "connect"
    if any(map(is_redrive_header, names)):
        return "redrive"
    return "raw"


def _is_named(item: object) -> bool:
    """A header as confluent-kafka gives it: a pair with a str name."""
    return type(item) is tuple and len(item) == 2 and isinstance(item[0], str)


def _is_spring(name: str) -> bool:
    return name.startswith(SPRING_PREFIX)


def _is_connect(name: str) -> bool:
    return name.startswith(CONNECT_PREFIX)


@dataclass(slots=True)
class _Fields:
    """What the metadata of one record says, and why it is a dead letter."""

    reason: str
    code: DeadLetterReason = DeadLetterReason.INGESTED
    topic: str | None = None
    attempt: int | None = None
    history: FailureHistory = field(default_factory=FailureHistory)
    unreadable: tuple[str, ...] = ()


class _Meta:
    """The metadata headers of a record, read one at a time; remembers what failed."""

    def __init__(self, meta: list[Header]) -> None:
        self.first: dict[str, object] = {}
        self.last: dict[str, object] = {}
        for name, value in meta:
            self.first.setdefault(name, value)
            self.last[name] = value
        self.unreadable: list[str] = []

    def get(self, name: str, parse: Callable[[object], T | None]) -> T | None:
        """The value of header ``name`` (None: absent, null or unreadable)."""
        value = (self.first if name in _ORIGINS else self.last).get(name)
        if value is None:
            return None
        try:
            return parse(value)
        except ValueError:  # the parsers' one way of saying "unreadable"
            self.unreadable.append(name)
            return None


def _utf8(value: object) -> str:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise ValueError("not bytes")
    return bytes(value).decode("utf-8")  # UnicodeDecodeError is a ValueError


def _topic(value: object) -> str:
    text = _utf8(value)
    if not is_topic_name(text):
        raise ValueError("not a topic name")
    return text


def _text(cap: int, keep: Literal["start", "end"] = "start") -> Callable[[object], str | None]:
    """UTF-8 text within ``cap`` bytes (cut as a request's would be); empty: None."""
    return lambda value: cap_text(_utf8(value), cap, keep=keep) or None


def _signed(value: object, size: int) -> int:
    """A signed big-endian integer of exactly ``size`` bytes, as Java's ByteBuffer."""
    if not isinstance(value, bytes | bytearray | memoryview) or len(raw := bytes(value)) != size:
        raise ValueError("wrong size")
    return int.from_bytes(raw, "big", signed=True)


def _big_endian(size: int, maximum: int) -> Callable[[object], int]:
    return lambda value: _in_range(_signed(value, size), maximum)


def _decimal(maximum: int) -> Callable[[object], int]:
    def parse(value: object) -> int:
        text = _utf8(value)
        if _DECIMAL_RE.fullmatch(text) is None:
            raise ValueError("not a decimal integer")
        return _in_range(int(text), maximum)

    return parse


def _in_range(number: int, maximum: int) -> int:
    if not 0 <= number <= maximum:
        raise ValueError("out of range")
    return number


def _timestamp(value: object) -> int | None:
    number = _signed(value, 8)
    return None if number == _NO_TIMESTAMP else _in_range(number, MAX_INT64)


def _short(text: str) -> str:
    return cap_text(text, _SHORT)


def _spring(meta: list[Header], where: str) -> _Fields:
    m = _Meta(meta)
    error_type = m.get(f"{_S}exception-fqcn", _text(MAX_VALUE_BYTES))
    message = m.get(f"{_S}exception-message", _text(MAX_ERROR_MESSAGE_BYTES))
    trace = m.get(f"{_S}exception-stacktrace", _text(MAX_ERROR_TRACE_BYTES, "end"))
    # A key that did not deserialize has its own headers (and a value too, when both
    # failed: then the value's are the ones kept).
    key_type = m.get(f"{_S}key-exception-fqcn", _text(MAX_VALUE_BYTES))
    key_message = m.get(f"{_S}key-exception-message", _text(MAX_ERROR_MESSAGE_BYTES))
    key_trace = m.get(f"{_S}key-exception-stacktrace", _text(MAX_ERROR_TRACE_BYTES, "end"))
    cause = m.get(f"{_S}exception-cause-fqcn", _text(MAX_VALUE_BYTES))
    topic = m.get(f"{_S}original-topic", _topic)
    error = (error_type, message, trace)
    if not any(error):
        error = (key_type, key_message, key_trace)
    history = FailureHistory(
        group=m.get(f"{_S}original-consumer-group", _text(MAX_VALUE_BYTES)),
        original_topic=topic,
        original_partition=m.get(f"{_S}original-partition", _big_endian(4, MAX_INT32)),
        original_offset=m.get(f"{_S}original-offset", _big_endian(8, MAX_INT64)),
        original_timestamp=m.get(f"{_S}original-timestamp", _timestamp),
        error_type=error[0],
        error_message=error[1],
        error_trace=error[2],
    )
    # What failed, for a person: the root cause's class when Spring names it (the
    # exception itself is mostly a ListenerExecutionFailedException wrapping it).
    failure = _failure(cause or history.error_type, history.error_message)
    what = "Spring Kafka dead letter" if m.first else "record without kafka_dlt- headers"
    return _Fields(
        reason=f"{what} ingested from {where}{failure}",
        topic=topic,
        history=history,
        unreadable=tuple(m.unreadable),
    )


def _connect(meta: list[Header], where: str) -> _Fields:
    m = _Meta(meta)
    topic = m.get(f"{_C}topic", _topic)
    context = [
        f"{label} {_short(text)}"
        for label, name in (
            ("connector", "connector.name"),
            ("task", "task.id"),
            ("stage", "stage"),
        )
        if (text := m.get(_C + name, _text(MAX_VALUE_BYTES))) is not None
    ]
    history = FailureHistory(
        original_topic=topic,
        original_partition=m.get(f"{_C}partition", _decimal(MAX_INT32)),
        original_offset=m.get(f"{_C}offset", _decimal(MAX_INT64)),
        error_type=m.get(f"{_C}exception.class.name", _text(MAX_VALUE_BYTES)),
        error_message=m.get(f"{_C}exception.message", _text(MAX_ERROR_MESSAGE_BYTES)),
        error_trace=m.get(f"{_C}exception.stacktrace", _text(MAX_ERROR_TRACE_BYTES, "end")),
    )
    what = "Kafka Connect dead letter" if m.first else "record without __connect.errors. headers"
    about = f" ({', '.join(context)})" if context else ""
    failure = _failure(history.error_type, history.error_message)
    return _Fields(
        reason=f"{what}{about} ingested from {where}{failure}",
        topic=topic,
        history=history,
        unreadable=tuple(m.unreadable),
    )


def _redrive(meta: list[Header], where: str) -> _Fields:
    m = _Meta(meta)
    # A dead letter's retry-at means nothing: a valid one is put in, so that the
    # reader keeps the rest. Without a usable destination, a stand-in (not kept).
    read = read_delivery_headers([*meta, (RETRY_AT, b"0")])
    has_destination = read is not None
    if read is None:
        read = read_delivery_headers([*meta, (DESTINATION, b"_"), (RETRY_AT, b"0")])
    if read is None:  # not expected: the stand-ins are valid
        read = RetryHeaders(destination="_", retry_at=0)
        has_destination = False
    unreadable = [
        name
        for name in FIELD_OF
        if name not in (RETRY_AT, DESTINATION, ATTEMPT, SEND_TO)
        and m.last.get(name) is not None
        and getattr(read, FIELD_OF[name]) is None
    ]
    if m.last.get(DESTINATION) is not None and not has_destination:
        unreadable.insert(0, DESTINATION)
    attempt = m.get(ATTEMPT, _decimal(MAX_INT32))  # which notes a value not a number
    if attempt is not None and attempt != read.attempt:  # one the contract refuses
        unreadable.append(ATTEMPT)
        attempt = None
    send_to = m.last.get(SEND_TO)
    if send_to is not None and send_to != read.send_to.encode():
        unreadable.append(SEND_TO)
    said = m.get(DEAD_LETTER_REASON, _text(MAX_ERROR_MESSAGE_BYTES))
    code = DeadLetterReason.INGESTED
    if said in _CODES:
        code, said = DeadLetterReason(said), None
    elif read.send_to == "dlq":
        code = DeadLetterReason.SENT_TO_DLQ
    why = said or read.reason
    failure = f": {_short(why)}" if why else _failure(read.error_type, read.error_message)
    what = "redrive dead letter" if m.first else "record without redrive- headers"
    return _Fields(
        reason=f"{what} ingested from {where}{failure}",
        code=code,
        topic=read.destination if has_destination else read.original_topic,
        attempt=attempt,
        history=FailureHistory(**read.failure_history()),
        unreadable=(*unreadable, *m.unreadable),
    )


def _raw(meta: list[Header], where: str) -> _Fields:
    return _Fields(reason=f"record without dead-letter metadata ingested from {where}")


def _failure(error_type: str | None, message: str | None) -> str:
    """``: type: message`` for a reason (what of it is known), or nothing."""
    parts = [_short(text) for text in (error_type, message) if text]
    return f": {': '.join(parts)}" if parts else ""


def _never(name: str) -> bool:
    return False


_METADATA: Final[dict[str, Callable[[str], bool]]] = {
    "spring": _is_spring,
    "connect": _is_connect,
    "redrive": is_redrive_header,
    "raw": _never,
}
_READERS: Final[dict[str, Callable[[list[Header], str], _Fields]]] = {
    "spring": _spring,
    "connect": _connect,
    "redrive": _redrive,
    "raw": _raw,
}
