"""Searches of dead letters and pending retries as SQL conditions.

A search is any value with the fields below (the API's filter models are); every
field given must match (AND). The SQL is made of fixed fragments with every value
passed as a parameter, so no search text can change a query.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol


class DeadLetterSearch(Protocol):
    """Which dead letters: exact topic, group, error type, source; text found in the
    error message; a reason code or text found in the reason; the dead-letter topic
    it was ingested from; dead since / before a time."""

    @property
    def topic(self) -> str | None: ...
    @property
    def group(self) -> str | None: ...
    @property
    def error_type(self) -> str | None: ...
    @property
    def text(self) -> str | None: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def source(self) -> str | None: ...
    @property
    def ingested_from(self) -> str | None: ...
    @property
    def since(self) -> datetime | None: ...
    @property
    def until(self) -> datetime | None: ...


class PendingSearch(Protocol):
    """Which pending retries: exact destination and group; due from / before a time
    (epoch milliseconds)."""

    @property
    def destination(self) -> str | None: ...
    @property
    def group(self) -> str | None: ...
    @property
    def due_after_ms(self) -> int | None: ...
    @property
    def due_before_ms(self) -> int | None: ...


Where = tuple[str, list[Any]]
"""A SQL condition on a table's columns and its parameters, in order."""


def _like(text: str) -> str:
    """A LIKE pattern matching `text` anywhere, with LIKE's wildcards taken literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


class _Clauses:
    """Conditions ANDed together, each with its parameters."""

    def __init__(self) -> None:
        self.sql: list[str] = []
        self.params: list[Any] = []

    def add(self, sql: str, *params: Any) -> None:
        self.sql.append(sql)
        self.params += params

    def where(self) -> Where:
        return (" AND ".join(self.sql) or "TRUE"), self.params


def dead_letters_where(s: DeadLetterSearch) -> Where:
    """The condition on `redrive_dead_letters` that the search means."""
    c = _Clauses()
    if s.topic is not None:
        c.add("topic = %s", s.topic)
    if s.group is not None:
        c.add("group_id = %s", s.group)
    if s.error_type is not None:
        c.add("error_type = %s", s.error_type)
    if s.text is not None:
        c.add("error_message ILIKE %s", _like(s.text))
    if s.reason is not None:
        c.add("(reason_code = %s OR reason ILIKE %s)", s.reason, _like(s.reason))
    if s.source is not None:
        c.add("source = %s", s.source)
    if s.ingested_from is not None:
        c.add("source LIKE 'ingest:%%' AND request_topic = %s", s.ingested_from)
    if s.since is not None:
        c.add("dead_at >= %s", s.since)
    if s.until is not None:
        c.add("dead_at < %s", s.until)
    return c.where()


def pending_where(s: PendingSearch) -> Where:
    """The condition on `redrive_pending` that the search means."""
    c = _Clauses()
    if s.destination is not None:
        c.add("destination = %s", s.destination)
    if s.group is not None:
        c.add("group_id = %s", s.group)
    if s.due_after_ms is not None:
        c.add("due_ms >= %s", s.due_after_ms)
    if s.due_before_ms is not None:
        c.add("due_ms < %s", s.due_before_ms)
    return c.where()
