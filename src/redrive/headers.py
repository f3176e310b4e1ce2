"""The redrive header contract (``docs/headers.md``), as pure functions on header lists.

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
- :func:`next_request` builds the request a consumer writes after a failure, and
  :func:`failure_request_id` the ``redrive-id`` that names it.

Import everything from here. The names, caps and :class:`RetryHeaders` are defined in
:mod:`redrive.header_fields` and the readers in :mod:`redrive.header_decoding`, each
short enough to read whole; this module writes requests and describes failures.
"""

from __future__ import annotations

import hashlib
import json
import traceback
from collections.abc import Iterable
from typing import NamedTuple

from redrive.header_decoding import decode as decode
from redrive.header_decoding import read_delivery_headers as read_delivery_headers
from redrive.header_decoding import read_replay as read_replay
from redrive.header_decoding import read_run as read_run
from redrive.header_fields import ALL_HEADERS as ALL_HEADERS
from redrive.header_fields import ATTEMPT as ATTEMPT
from redrive.header_fields import DEAD_LETTER_REASON as DEAD_LETTER_REASON
from redrive.header_fields import DEADLINE as DEADLINE
from redrive.header_fields import DESTINATION as DESTINATION
from redrive.header_fields import ERROR_MESSAGE as ERROR_MESSAGE
from redrive.header_fields import ERROR_TRACE as ERROR_TRACE
from redrive.header_fields import ERROR_TYPE as ERROR_TYPE
from redrive.header_fields import FIELD_OF
from redrive.header_fields import GIVE_UPS as GIVE_UPS
from redrive.header_fields import GROUP as GROUP
from redrive.header_fields import ID as ID
from redrive.header_fields import ID_LENGTH as ID_LENGTH
from redrive.header_fields import MAX_ERROR_MESSAGE_BYTES as MAX_ERROR_MESSAGE_BYTES
from redrive.header_fields import MAX_ERROR_TRACE_BYTES as MAX_ERROR_TRACE_BYTES
from redrive.header_fields import MAX_INT32 as MAX_INT32
from redrive.header_fields import MAX_INT64 as MAX_INT64
from redrive.header_fields import MAX_TOPIC_LENGTH as MAX_TOPIC_LENGTH
from redrive.header_fields import MAX_VALUE_BYTES as MAX_VALUE_BYTES
from redrive.header_fields import ORDER as ORDER
from redrive.header_fields import ORDERS as ORDERS
from redrive.header_fields import ORIGINAL_OFFSET as ORIGINAL_OFFSET
from redrive.header_fields import ORIGINAL_PARTITION as ORIGINAL_PARTITION
from redrive.header_fields import ORIGINAL_TIMESTAMP as ORIGINAL_TIMESTAMP
from redrive.header_fields import ORIGINAL_TOPIC as ORIGINAL_TOPIC
from redrive.header_fields import PARTITION as PARTITION
from redrive.header_fields import REASON as REASON
from redrive.header_fields import REASON_CODE as REASON_CODE
from redrive.header_fields import REDRIVE_PREFIX as REDRIVE_PREFIX
from redrive.header_fields import REPLAY_OF as REPLAY_OF
from redrive.header_fields import REPLAYS as REPLAYS
from redrive.header_fields import REQUIRED_HEADERS as REQUIRED_HEADERS
from redrive.header_fields import RETRY_AT as RETRY_AT
from redrive.header_fields import RUN as RUN
from redrive.header_fields import SEND_TO as SEND_TO
from redrive.header_fields import SIGNATURE as SIGNATURE
from redrive.header_fields import TRUNCATED_PREFIX as TRUNCATED_PREFIX
from redrive.header_fields import TRUNCATED_SUFFIX as TRUNCATED_SUFFIX
from redrive.header_fields import FailureHistory as FailureHistory
from redrive.header_fields import GiveUp as GiveUp
from redrive.header_fields import Header as Header
from redrive.header_fields import HeaderError as HeaderError
from redrive.header_fields import Order as Order
from redrive.header_fields import RetryHeaders as RetryHeaders
from redrive.header_fields import SendTo as SendTo
from redrive.header_fields import cap_text as cap_text
from redrive.header_fields import is_redrive_header as is_redrive_header
from redrive.header_fields import is_topic_name as is_topic_name


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
    for header, field_name in FIELD_OF.items():
        value = getattr(h, field_name)
        if value is None:
            continue
        text = str(value) if isinstance(value, int) else value
        out.append((header, text.encode("utf-8", "replace")))
    return out


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
    trace = "".join(_without_columns(traceback.TracebackException.from_exception(error)).format())
    return ErrorInfo(
        cap_text(qualified_name(type(error)), MAX_VALUE_BYTES),
        cap_text(message, MAX_ERROR_MESSAGE_BYTES),
        cap_text(trace, MAX_ERROR_TRACE_BYTES, keep="end"),
    )


def _without_columns(trace: traceback.TracebackException) -> traceback.TracebackException:
    """The trace without the column markers (``^^^^``) under each line of source: to
    place them Python parses every frame's line again, which costs more than the rest
    of the trace, on every failure a handler raises."""
    pending, seen = [trace], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for frame in current.stack:
            frame.colno = None
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        pending.extend(getattr(current, "exceptions", None) or ())
    return trace


def request_id(request: RetryHeaders) -> str:
    """The ``redrive-id`` of a request written from its fields: its group, original
    topic, partition and offset, and attempt (a record put behind its key's retry, a
    release, a request from a sender that names no id).

    A digest (BLAKE2b, 16 bytes, as :data:`ID_LENGTH` hex characters), deterministic,
    so that the same request written again after a crash carries the same id, and
    without what varies between two writes of it (the due time, the error text). A
    record put behind its key's retry has attempt 0, which no failure has; a release
    names the retry it ends, so its fields are those of that retry, told apart by a
    prefix. A consumer's hand-off of a failure is named by :func:`failure_request_id`.
    """
    return failure_id(
        request.group,
        request.original_topic,
        request.original_partition,
        request.original_offset,
        request.attempt,
        release=request.order == "release",
    )


def failure_request_id(
    group: str, attempt: int, read_at: tuple[str, int, int], delivered_as: str | None
) -> str:
    """The ``redrive-id`` of one failure of one record in one group: the retry request
    or the dead letter a consumer hands it off as.

    The record is named by what cannot be forged or shared: the ``redrive-id`` of the
    request that ``delivered_as`` it (every delivery of that request, the repeats of a
    delivery included, is the same record), else where it was read (topic, partition,
    offset). Never by the original coordinates in its headers: any producer can write
    those, and two records that carry the same (copied along by a stream processor,
    say) are two records, whose failures must not pass for repeats of each other.

    Deterministic, so that a hand-off repeated after a crash (the record read again at
    the same place, or delivered again) carries the same id. The attempt is in it
    because each retry of a record is a new request: the record failing again after
    its redelivery is a new failure, with its own id. A dead letter is that failure
    handed off the other way, so it has the id a retry of it would have: a failure
    retried before a crash and dead-lettered after it (its deadline passed meanwhile)
    is still one failure. A first failure's id is :func:`request_id` of its request,
    whose original coordinates are where it was read.
    """
    if delivered_as is None:
        return failure_id(group, *read_at, attempt)
    return _digest([group, {"delivered-as": delivered_as}, attempt])


def failure_id(
    group: str | None,
    topic: str | None,
    partition: int | None,
    offset: int | None,
    attempt: int,
    *,
    release: bool = False,
) -> str:
    """:func:`request_id` from its fields (a stored row's columns, say)."""
    fields: list[object] = [group, topic, partition, offset, attempt]
    if release:  # not the failure: the consumer is done with it
        fields.insert(0, "release")
    return _digest(fields)


def _digest(fields: list[object]) -> str:
    # JSON keeps the fields apart whatever a group name contains (a separator, say).
    data = json.dumps(fields, separators=(",", ":")).encode("utf-8")
    return hashlib.blake2b(data, digest_size=ID_LENGTH // 2).hexdigest()


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
    reason_code: GiveUp | None = None,
    replay: tuple[int, int] | None = None,
) -> RetryHeaders:
    """The retry request a consumer writes after its handler failed on a message.

    ``previous`` is what :func:`read_delivery_headers` found on the message (None for a
    first delivery). The attempt becomes ``previous.attempt + 1`` (or 1); the original-*
    coordinates are copied from ``previous`` when it has any, otherwise taken from the
    record being handled (``record_*``), so they always name the first consumption; the
    error-* fields are replaced by ``error``. ``deadline`` and ``group`` default to the
    previous request's. ``partition`` is the destination partition (None: by key).
    ``attempt`` overrides the count when the caller knows better (a record retried in
    place carries no previous request); ``reason`` says why a dead letter gave up,
    ``reason_code`` the same for machines. The replay the message came from
    (``redrive-replays``, ``redrive-replay-of``) is copied from ``previous``, else taken
    from ``replay`` (what :func:`read_replay` found on a replayed record's first
    failure), so that its dead letter still says which letter it came back from.
    """
    if isinstance(error, BaseException):
        info = describe_error(error)
    else:
        error_type, message, trace = error
        info = ErrorInfo(cap_text(error_type, MAX_VALUE_BYTES), message, trace)
    origin = (record_topic, record_partition, record_offset, record_timestamp)
    if previous is not None and previous.replays is not None and previous.replay_of is not None:
        replay = (previous.replays, previous.replay_of)
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
        reason_code=reason_code,
        replays=None if replay is None else replay[0],
        replay_of=None if replay is None else replay[1],
    )
