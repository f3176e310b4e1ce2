"""Reading one dialect's metadata headers: the values, and what could not be read.

Every dialect reader (:mod:`redrive.service.ingest`) works on the metadata headers of
one record through :class:`Meta` and its parsers, and says what it found as
:class:`Fields`. A parser raises ``ValueError`` for a value it cannot read; :meth:`Meta.get`
turns that into None and remembers the header's name, which the letter's reason
lists (``; kafka_dlt-original-offset unreadable``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar

from redrive.header_fields import FailureHistory
from redrive.headers import (
    MAX_ERROR_MESSAGE_BYTES,
    MAX_ERROR_TRACE_BYTES,
    MAX_INT32,
    MAX_INT64,
    MAX_VALUE_BYTES,
    Header,
    cap_text,
    is_topic_name,
)
from redrive.reasons import DeadLetterReason

T = TypeVar("T")

_SHORT: Final = 200
"""Most UTF-8 bytes of a name or message quoted in a reason."""
_DECIMAL_RE: Final = re.compile(r"[0-9]{1,19}")  # ASCII digits; 19 hold any int64
_NO_TIMESTAMP: Final = -1  # Kafka's "no timestamp", which Java writes as it is


@dataclass(slots=True)
class Fields:
    """What the metadata of one record says, and why it is a dead letter."""

    reason: str
    code: DeadLetterReason = DeadLetterReason.INGESTED
    topic: str | None = None
    attempt: int | None = None
    history: FailureHistory = field(default_factory=FailureHistory)
    unreadable: tuple[str, ...] = ()
    needs_record: bool = False
    """The letter carries no copy of the failed record: its key, value and headers are
    to be read from the original topic (:mod:`redrive.service.ingest.originals`)."""


class Meta:
    """The metadata headers of a record, read one at a time; remembers what failed.

    Of a repeated header, the first counts when its name is in ``first_of`` (where a
    record was first consumed: systems that dead-letter a record again append a new
    set), the last otherwise (the latest failure)."""

    def __init__(self, meta: list[Header], first_of: Collection[str] = ()) -> None:
        self.first: dict[str, object] = {}
        self.last: dict[str, object] = {}
        for name, value in meta:
            self.first.setdefault(name, value)
            self.last[name] = value
        self._first_of = first_of
        self.unreadable: list[str] = []

    def __bool__(self) -> bool:
        return bool(self.first)

    def get(self, name: str, parse: Callable[[object], T | None]) -> T | None:
        """The value of header ``name`` (None: absent, null or unreadable)."""
        value = (self.first if name in self._first_of else self.last).get(name)
        if value is None:
            return None
        try:
            return parse(value)
        except ValueError:  # the parsers' one way of saying "unreadable"
            self.unreadable.append(name)
            return None

    def any(self, *names: str, parse: Callable[[object], T | None]) -> T | None:
        """The value of the first of ``names`` that is present and readable."""
        for name in names:
            if (value := self.get(name, parse)) is not None:
                return value
        return None


def utf8(value: object) -> str:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise ValueError("not bytes")
    return bytes(value).decode("utf-8")  # UnicodeDecodeError is a ValueError


def topic(value: object) -> str:
    text = utf8(value)
    if not is_topic_name(text):
        raise ValueError("not a topic name")
    return text


def text(cap: int, keep: Literal["start", "end"] = "start") -> Callable[[object], str | None]:
    """UTF-8 text within ``cap`` bytes (cut as a request's would be); empty: None."""
    return lambda value: cap_text(utf8(value), cap, keep=keep) or None


def signed(value: object, size: int) -> int:
    """A signed big-endian integer of exactly ``size`` bytes, as Java's ByteBuffer."""
    if not isinstance(value, bytes | bytearray | memoryview) or len(raw := bytes(value)) != size:
        raise ValueError("wrong size")
    return int.from_bytes(raw, "big", signed=True)


def big_endian(size: int, maximum: int) -> Callable[[object], int]:
    return lambda value: in_range(signed(value, size), maximum)


def big_integer(maximum: int) -> Callable[[object], int]:
    """A signed big-endian integer of 1 to 8 bytes, as Java's ``BigInteger.toByteArray``."""

    def parse(value: object) -> int:
        if not isinstance(value, bytes | bytearray | memoryview) or not 1 <= len(value) <= 8:
            raise ValueError("wrong size")
        return in_range(int.from_bytes(bytes(value), "big", signed=True), maximum)

    return parse


def decimal(maximum: int) -> Callable[[object], int]:
    def parse(value: object) -> int:
        digits = utf8(value)
        if _DECIMAL_RE.fullmatch(digits) is None:
            raise ValueError("not a decimal integer")
        return in_range(int(digits), maximum)

    return parse


def in_range(number: int, maximum: int) -> int:
    if not 0 <= number <= maximum:
        raise ValueError("out of range")
    return number


def timestamp(value: object) -> int | None:
    """An 8-byte timestamp; Kafka's "no timestamp" (-1) is None, not a problem."""
    number = signed(value, 8)
    return None if number == _NO_TIMESTAMP else in_range(number, MAX_INT64)


def text_origin(m: Meta, prefix: str) -> dict[str, Any]:
    """Where the failed record was read, from ``<prefix>topic``, ``<prefix>partition``
    and ``<prefix>offset`` in UTF-8 text, the numbers in decimal (as Connect, Streams
    and a share group's DLQ write them): :class:`FailureHistory` fields."""
    return {
        "original_topic": m.get(f"{prefix}topic", topic),
        "original_partition": m.get(f"{prefix}partition", decimal(MAX_INT32)),
        "original_offset": m.get(f"{prefix}offset", decimal(MAX_INT64)),
    }


def text_error(m: Meta, type_name: str, message: str, trace: str) -> dict[str, Any]:
    """The failure from the headers named: its class, message and stack trace, in UTF-8
    text, capped as a request's are: :class:`FailureHistory` fields."""
    return {
        "error_type": m.get(type_name, text(MAX_VALUE_BYTES)),
        "error_message": m.get(message, text(MAX_ERROR_MESSAGE_BYTES)),
        "error_trace": m.get(trace, text(MAX_ERROR_TRACE_BYTES, "end")),
    }


def short(value: str) -> str:
    return cap_text(value, _SHORT)


def failure(error_type: str | None, message: str | None) -> str:
    """``: type: message`` for a reason (what of it is known), or nothing."""
    parts = [short(part) for part in (error_type, message) if part]
    return f": {': '.join(parts)}" if parts else ""


def has_prefix(*prefixes: str) -> Callable[[str], bool]:
    return lambda name: name.startswith(prefixes)
