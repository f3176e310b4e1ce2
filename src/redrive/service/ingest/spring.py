"""Spring Kafka's ``DeadLetterPublishingRecoverer`` (with ``DefaultErrorHandler``).

Its dead letters carry ``kafka_dlt-*`` headers: partition a 4-byte and offset and
timestamp 8-byte big-endian signed integers, the rest UTF-8 text, as its
``DeadLetterRecordManager`` writes them. Spring appends a new set of original-*
headers each time a record is dead-lettered again (``appendOriginalHeaders``, on by
default) and adds the current exception after older ones: the first original names
the first consumption, the last exception is the latest failure.

Every header in Spring's namespaces (``kafka_``, ``retry_topic-``) is Spring's, not the
record's: a record that passed through retry topics before it was dead-lettered
carries their retry state too, and a replay must not hand that back to Spring.

The error type is the root cause's class when Spring names it: the exception itself
is mostly a ``ListenerExecutionFailedException`` wrapping it, and operators search
by what failed.
"""

from __future__ import annotations

from typing import Final

from redrive.header_fields import FailureHistory
from redrive.headers import (
    MAX_ERROR_MESSAGE_BYTES,
    MAX_ERROR_TRACE_BYTES,
    MAX_INT32,
    MAX_INT64,
    MAX_VALUE_BYTES,
    Header,
)
from redrive.requests import Incoming
from redrive.service.ingest import reading as r
from redrive.service.ingest.dialect import Dialect, described

PREFIX: Final = "kafka_dlt-"
NAMESPACES: Final = ("kafka_", "retry_topic-")
RETRY_TOPIC_ORIGINAL: Final = "kafka_original-"
"""Where @RetryableTopic's DLT names the record's origin (:mod:`.spring_retry_topic`)."""
"""Spring's header namespaces: everything its error handling writes is in one."""

ORIGINS: Final = frozenset(
    f"{PREFIX}original-{name}"
    for name in ("topic", "partition", "offset", "timestamp", "timestamp-type", "consumer-group")
)


def error_of(m: r.Meta, prefix: str) -> tuple[str | None, str | None, str | None]:
    """The failure's type, message and trace from ``<prefix>exception-*`` headers (a key
    that did not deserialize has its own ``<prefix>key-exception-*``; when both failed,
    the value's are kept). The type is the root cause's class when Spring names it."""
    found = []
    for kind in ("exception", "key-exception"):
        found.append(
            (
                m.get(f"{prefix}{kind}-cause-fqcn", r.text(MAX_VALUE_BYTES))
                or m.get(f"{prefix}{kind}-fqcn", r.text(MAX_VALUE_BYTES)),
                m.get(f"{prefix}{kind}-message", r.text(MAX_ERROR_MESSAGE_BYTES)),
                m.get(f"{prefix}{kind}-stacktrace", r.text(MAX_ERROR_TRACE_BYTES, "end")),
            )
        )
    value, key = found
    return value if any(value) else key


def _read(meta: list[Header], incoming: Incoming) -> r.Fields:
    m = r.Meta(meta, ORIGINS)
    error_type, message, trace = error_of(m, PREFIX)
    topic = m.get(f"{PREFIX}original-topic", r.topic)
    history = FailureHistory(
        group=m.get(f"{PREFIX}original-consumer-group", r.text(MAX_VALUE_BYTES)),
        original_topic=topic,
        original_partition=m.get(f"{PREFIX}original-partition", r.big_endian(4, MAX_INT32)),
        original_offset=m.get(f"{PREFIX}original-offset", r.big_endian(8, MAX_INT64)),
        original_timestamp=m.get(f"{PREFIX}original-timestamp", r.timestamp),
        error_type=error_type,
        error_message=message,
        error_trace=trace,
    )
    what = "Spring Kafka dead letter" if m else "record without kafka_dlt- headers"
    return described(m, incoming, what, history, about=_unplaced(meta, history) if m else "")


def _unplaced(meta: list[Header], history: FailureHistory) -> str:
    """What the reason says of a letter that does not say where its record was first
    consumed: the headers it lacks, and the format that reads it, if another does."""
    missing = [
        f"{PREFIX}original-{name}"
        for name, value in (
            ("topic", history.original_topic),
            ("partition", history.original_partition),
            ("offset", history.original_offset),
        )
        if value is None
    ]
    if not missing:
        return ""
    said = f" without {', '.join(missing)} (where its record was first consumed is unknown"
    if any(name.startswith(RETRY_TOPIC_ORIGINAL) for name, _ in meta):
        said += "; it has kafka_original- headers, as @RetryableTopic's DLT writes them: "
        said += "read that topic with format spring-retry-topic"
    return said + ")"


DIALECT: Final = Dialect(
    name="spring",
    is_metadata=r.has_prefix(*NAMESPACES),
    marks=r.has_prefix(PREFIX),
    read=_read,
)
