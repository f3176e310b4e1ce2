"""Reading redrive headers off a record: strictly (:func:`decode`) or leniently
(:func:`read_delivery_headers`).

:func:`decode` judges retry requests that anyone may have written, so it must answer
exactly one way whatever it is given: a :class:`RetryHeaders`, or a
:class:`HeaderError` naming the header at fault. It reads the usual case, a valid
request in confluent-kafka's list of tuples, in one pass (``_decode_fast``); anything
else goes the careful way (``_decode_checked``), the reference for every answer. Both
paths live here, next to each other, because they must agree (``tests/unit/test_headers.py``
checks that they do). Users import these from :mod:`redrive.headers`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import fields
from typing import Any, Final, TypeAlias

from redrive.header_fields import (
    ATTEMPT,
    DEADLINE,
    DESTINATION,
    ERROR_MESSAGE,
    ERROR_TRACE,
    ERROR_TYPE,
    FIELD_OF,
    GIVE_UPS,
    GROUP,
    ID,
    ID_LENGTH,
    INT_HEADERS,
    MAX_INT32,
    MAX_INT64,
    MAX_TOPIC_LENGTH,
    ORDER,
    ORDERS,
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TIMESTAMP,
    ORIGINAL_TOPIC,
    PARTITION,
    REASON,
    REASON_CODE,
    REPLAY_OF,
    REPLAYS,
    REQUIRED_HEADERS,
    RETRY_AT,
    RUN,
    SEND_TO,
    SIGNATURE,
    Header,
    HeaderError,
    RetryHeaders,
    cap_of,
    is_redrive_header,
    show_value,
)

_DIGITS_RE: Final = re.compile(r"[0-9]+")
_NEGATIVE_RE: Final = re.compile(r"-[0-9]+")


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
            raise HeaderError(
                None, f"header {index} is not a (name, value) pair: {show_value(item)}"
            )
        name, value = item
        if not isinstance(name, str):
            raise HeaderError(None, f"header {index} has a non-str name: {show_value(name)}")
        pairs.append((index, name, value))
    return pairs


def _decode_value(header: str, value: object) -> str:
    """Validate size and UTF-8 of one raw redrive header value."""
    if value is None:
        raise HeaderError(header, "value is null")
    if not isinstance(value, bytes | bytearray | memoryview):
        raise HeaderError(header, f"value must be bytes, got {type(value).__name__}")
    raw = bytes(value)
    cap = cap_of(header)
    if len(raw) > cap:
        raise HeaderError(header, f"too long: {len(raw)} bytes (max {cap})")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HeaderError(header, f"not valid UTF-8: {show_value(raw)}") from None


def _parse_int(header: str, text: str) -> int:
    if _DIGITS_RE.fullmatch(text):
        return int(text)
    if _NEGATIVE_RE.fullmatch(text):
        raise HeaderError(header, f"must not be negative: {show_value(text)}")
    raise HeaderError(header, f"not a decimal integer: {show_value(text)}")


def _field_values(header: str, text: str) -> object:
    return _parse_int(header, text) if header in INT_HEADERS else text


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
        if name not in FIELD_OF:
            raise HeaderError(name, "unknown redrive header (misspelt?)")
        if FIELD_OF[name] in values:
            raise HeaderError(name, "appears more than once")
        values[FIELD_OF[name]] = _field_values(name, _decode_value(name, value))
    for header in REQUIRED_HEADERS:
        if FIELD_OF[header] not in values:
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
_ID: Final = 5  # ID_LENGTH lowercase hex characters (ASCII, so its bytes can be checked)
_ORDER: Final = 6  # b"key", b"behind" or b"release"
_ORDER_BYTES: Final = frozenset(order.encode("ascii") for order in ORDERS)
_GIVE_UP: Final = 7  # one of GIVE_UPS; beside redrive-send-to: dlq (checked at the end)
_GIVE_UP_BYTES: Final = frozenset(code.encode("ascii") for code in GIVE_UPS)
_Rule: TypeAlias = tuple[str, int, int, int, int]


def _rule(header: str, kind: int, minimum: int = 0, maximum: int = 0) -> _Rule:
    # Field and cap come from the tables the careful path uses, so they cannot drift.
    return (FIELD_OF[header], kind, cap_of(header), minimum, maximum)


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
    ID: _rule(ID, _ID),
    # An attempt of 0 (a record behind its key's head) takes the careful path.
    ORDER: _rule(ORDER, _ORDER),
    REASON_CODE: _rule(REASON_CODE, _GIVE_UP),
    REPLAYS: _rule(REPLAYS, _INT, 0, MAX_INT32),
    REPLAY_OF: _rule(REPLAY_OF, _INT, 0, MAX_INT64),
    # Its form and MAC are redrive.signing's to judge: here it is text, as the careful
    # path's _check_text asks.
    SIGNATURE: _rule(SIGNATURE, _TEXT),
}
_TOPIC_BYTES: Final = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
"""The characters of header_fields._TOPIC_RE: bytes made only of them strip to nothing."""
_HEX_BYTES: Final = b"0123456789abcdef"
"""The characters of header_fields._ID_RE, the same way."""


def _is_topic(raw: bytes) -> bool:
    """header_fields._check_topic's test on a name's bytes (a few times faster than a regex)."""
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
        if kind == _ID and (len(raw) != ID_LENGTH or raw.strip(_HEX_BYTES)):
            return None
        if kind == _ORDER and raw not in _ORDER_BYTES:
            return None
        if kind == _GIVE_UP and raw not in _GIVE_UP_BYTES:
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
    if "reason_code" in values and values.get("send_to") != "dlq":
        return None  # a reason code is a dead letter's only
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
        field_name = FIELD_OF.get(name)
        if field_name is None or not isinstance(value, bytes | bytearray | memoryview):
            continue
        try:
            text = bytes(value).decode("utf-8")
            values[field_name] = _field_values(name, text)
        except (UnicodeDecodeError, HeaderError):
            values.pop(field_name, None)
    if any(FIELD_OF[h] not in values for h in REQUIRED_HEADERS):
        return None
    # The signature was the request's, over the request as it was: whoever writes one
    # again from this delivery signs it again (or sends it unsigned), never with it.
    values.pop(FIELD_OF[SIGNATURE], None)
    while True:  # drop invalid fields one at a time until the rest is valid
        try:
            return RetryHeaders(**values)  # type: ignore[arg-type]
        except HeaderError as error:
            field_name = FIELD_OF.get(error.header or "")
            if field_name is None or error.header in REQUIRED_HEADERS:
                return None
            values.pop(field_name, None)


def read_replay(headers: Iterable[Header] | None) -> tuple[int, int] | None:
    """Leniently read ``(redrive-replays, redrive-replay-of)`` off a record: what a
    replayed dead letter carries even when no other redrive header is there (its first
    delivery after the replay). None unless both are there and valid; never raises."""
    found: dict[str, int] = {}
    try:
        pairs = _as_pairs(headers)
    except HeaderError:
        return None
    for _, name, value in pairs:
        if name not in (REPLAYS, REPLAY_OF):
            continue
        if not isinstance(value, bytes) or not value.isdigit() or len(value) > 19:
            found.pop(name, None)
            continue
        found[name] = int(value)
    replays, replay_of = found.get(REPLAYS), found.get(REPLAY_OF)
    if replays is None or replay_of is None or replays > MAX_INT32 or replay_of > MAX_INT64:
        return None
    return replays, replay_of


def read_run(headers: Iterable[Header] | None) -> int | None:
    """Leniently read ``redrive-run`` off a delivered record: the run of its key's queue
    the retry service delivered it in. None when absent or not a decimal integer in
    range (a first delivery, an unordered retry, a forged value); never raises."""
    if not headers:
        return None
    run = None
    for name, value in headers:
        if name == RUN:
            run = value
    if not isinstance(run, bytes) or not run.isdigit() or len(run) > 19:
        return None
    number = int(run)
    return number if number <= MAX_INT64 else None
