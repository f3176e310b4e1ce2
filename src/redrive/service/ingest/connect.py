"""Kafka Connect's ``DeadLetterQueueReporter``, with context headers on.

Its headers are ``__connect.errors.*``, every value UTF-8 text, numbers in decimal.
Connect writes no original timestamp, but the dead letter keeps the failed record's
own timestamp: that is the letter's original time.
"""

from __future__ import annotations

from typing import Final

from redrive.header_fields import FailureHistory
from redrive.headers import (
    MAX_VALUE_BYTES,
    Header,
)
from redrive.requests import Incoming
from redrive.service.ingest import reading as r
from redrive.service.ingest.dialect import Dialect, described

PREFIX: Final = "__connect.errors."
_ORIGINS: Final = frozenset(f"{PREFIX}{name}" for name in ("topic", "partition", "offset"))


def _read(meta: list[Header], incoming: Incoming) -> r.Fields:
    m = r.Meta(meta, _ORIGINS)
    context = [
        f"{label} {r.short(value)}"
        for label, name in (
            ("connector", "connector.name"),
            ("task", "task.id"),
            ("stage", "stage"),
        )
        if (value := m.get(PREFIX + name, r.text(MAX_VALUE_BYTES))) is not None
    ]
    error = [f"{PREFIX}exception.{name}" for name in ("class.name", "message", "stacktrace")]
    history = FailureHistory(
        **r.text_origin(m, PREFIX),
        original_timestamp=incoming.timestamp_ms if m else None,
        **r.text_error(m, *error),
    )
    what = "Kafka Connect dead letter" if m else "record without __connect.errors. headers"
    about = f" ({', '.join(context)})" if context else ""
    return described(m, incoming, what, history, about=about)


DIALECT: Final = Dialect(
    name="connect", is_metadata=r.has_prefix(PREFIX), marks=r.has_prefix(PREFIX), read=_read
)
