"""Spring Kafka's retry topics (``@RetryableTopic``, ``RetryTopicConfiguration``).

A record that failed on its main topic and each retry topic ends on the ``-dlt``
topic with Spring's non-DLT header names (the same from Spring Kafka 3.0 to 4.1):
``kafka_original-topic/-partition/-offset/-timestamp`` (4-byte and 8-byte big-endian
integers, as ``kafka_dlt-*``), ``kafka_exception-fqcn/-cause-fqcn/-message/-stacktrace``,
the retry state ``retry_topic-attempts`` (a 4-byte integer) and
``retry_topic-backoff-timestamp/-original-timestamp`` (``BigInteger`` bytes), each
written again at every hop, and ``kafka_dlt-original-consumer-group``. As with Spring's
dead letters (:mod:`.spring`), the first original counts and the last exception, the
root cause's class is the error type, and every header in Spring's namespaces stays
out of the letter: a replay carrying ``retry_topic-attempts`` would be sent straight
to the DLT again by the Spring application.
"""

from __future__ import annotations

from typing import Final

from redrive.header_fields import FailureHistory
from redrive.headers import MAX_INT32, MAX_INT64, MAX_VALUE_BYTES, Header
from redrive.requests import Incoming
from redrive.service.ingest import reading as r
from redrive.service.ingest import spring
from redrive.service.ingest.dialect import Dialect, described

PREFIX: Final = "kafka_"
RETRY_PREFIX: Final = "retry_topic-"
_ORIGINAL: Final = f"{PREFIX}original-"
_ORIGINS: Final = frozenset(
    {
        *(f"{_ORIGINAL}{name}" for name in ("topic", "partition", "offset", "timestamp")),
        f"{_ORIGINAL}timestamp-type",
        f"{_ORIGINAL}consumer-group",
        f"{RETRY_PREFIX}original-timestamp",
        *spring.ORIGINS,
    }
)


def _read(meta: list[Header], incoming: Incoming) -> r.Fields:
    m = r.Meta(meta, _ORIGINS)
    error_type, message, trace = spring.error_of(m, PREFIX)
    topic = m.get(f"{_ORIGINAL}topic", r.topic)
    history = FailureHistory(
        group=m.any(
            f"{spring.PREFIX}original-consumer-group",
            f"{_ORIGINAL}consumer-group",
            parse=r.text(MAX_VALUE_BYTES),
        ),
        original_topic=topic,
        original_partition=m.get(f"{_ORIGINAL}partition", r.big_endian(4, MAX_INT32)),
        original_offset=m.get(f"{_ORIGINAL}offset", r.big_endian(8, MAX_INT64)),
        original_timestamp=m.get(f"{_ORIGINAL}timestamp", r.timestamp)
        or m.get(f"{RETRY_PREFIX}original-timestamp", r.big_integer(MAX_INT64)),
        error_type=error_type,
        error_message=message,
        error_trace=trace,
    )
    attempts = m.get(f"{RETRY_PREFIX}attempts", r.big_endian(4, MAX_INT32))
    what = "Spring Kafka retry-topic dead letter" if m else "record without kafka_ headers"
    return described(m, incoming, what, history, attempt=attempts or None)


DIALECT: Final = Dialect(
    name="spring-retry-topic",
    is_metadata=r.has_prefix(*spring.NAMESPACES),
    marks=r.has_prefix(_ORIGINAL, f"{PREFIX}exception-", RETRY_PREFIX),
    read=_read,
)
