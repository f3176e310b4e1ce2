"""Kafka Streams' dead-letter queue (KIP-1034, Kafka 4.2+,
``errors.dead.letter.queue.topic.name``).

Its exception handlers write the failed record's key, value and headers with
``__streams.errors.exception/-message/-stacktrace`` (the exception's class, message
and trace) and ``__streams.errors.topic/-partition/-offset`` (where it was read), every
value UTF-8 text, numbers in decimal; the dead letter keeps the record's timestamp.
"""

from __future__ import annotations

from typing import Final

from redrive.header_fields import FailureHistory
from redrive.headers import (
    Header,
)
from redrive.requests import Incoming
from redrive.service.ingest import reading as r
from redrive.service.ingest.dialect import Dialect, described

PREFIX: Final = "__streams.errors."
_ORIGINS: Final = frozenset(f"{PREFIX}{name}" for name in ("topic", "partition", "offset"))


def _read(meta: list[Header], incoming: Incoming) -> r.Fields:
    m = r.Meta(meta, _ORIGINS)
    error = [f"{PREFIX}{name}" for name in ("exception", "message", "stacktrace")]
    history = FailureHistory(
        **r.text_origin(m, PREFIX),
        original_timestamp=incoming.timestamp_ms if m else None,
        **r.text_error(m, *error),
    )
    what = "Kafka Streams dead letter" if m else "record without __streams.errors. headers"
    return described(m, incoming, what, history)


DIALECT: Final = Dialect(
    name="streams", is_metadata=r.has_prefix(PREFIX), marks=r.has_prefix(PREFIX), read=_read
)
