"""Searches of dead letters, pending retries and the audit log as SQL conditions.

A search is any value with the fields below (the API's filter models are); every
field given (not None) must match (AND). The SQL is made of fixed fragments with
every value passed as a parameter, so no search text can change a query.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol


class DeadLetterSearch(Protocol):
    """Which dead letters: exact topic, group, error type, source; text found in the
    error message; a reason code or text found in the reason; the dead-letter topic
    it was ingested from; dead since / before a time; its error group."""

    topic: str | None
    group: str | None
    error_type: str | None
    text: str | None
    reason: str | None
    source: str | None
    ingested_from: str | None
    since: datetime | None
    until: datetime | None
    error_group: str | None


class PendingSearch(Protocol):
    """Which pending retries: exact destination and group; due from / before a time
    (epoch milliseconds)."""

    destination: str | None
    group: str | None
    due_after_ms: int | None
    due_before_ms: int | None


class AuditSearch(Protocol):
    """Which audit entries: exact actor and action; naming a letter id; at or after /
    before a time."""

    actor: str | None
    action: str | None
    letter: int | None
    since: datetime | None
    until: datetime | None


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

    def given(self, value: Any, sql: str) -> None:
        """`sql` with `value` as its parameter, unless the value is None (not asked)."""
        if value is not None:
            self.add(sql, value)

    def where(self) -> Where:
        return (" AND ".join(self.sql) or "TRUE"), self.params


def dead_letters_where(s: DeadLetterSearch) -> Where:
    """The condition on `redrive_dead_letters` that the search means."""
    c = _Clauses()
    c.given(s.topic, "topic = %s")
    c.given(s.group, "group_id = %s")
    c.given(s.error_type, "error_type = %s")
    c.given(None if s.text is None else _like(s.text), "error_message ILIKE %s")
    if s.reason is not None:
        c.add("(reason_code = %s OR reason ILIKE %s)", s.reason, _like(s.reason))
    c.given(s.source, "source = %s")
    c.given(s.ingested_from, "source LIKE 'ingest:%%' AND request_topic = %s")
    c.given(s.since, "dead_at >= %s")
    c.given(s.until, "dead_at < %s")
    c.given(s.error_group, "error_group = %s")
    return c.where()


def pending_where(s: PendingSearch) -> Where:
    """The condition on `redrive_pending` that the search means."""
    c = _Clauses()
    c.given(s.destination, "destination = %s")
    c.given(s.group, "group_id = %s")
    c.given(s.due_after_ms, "due_ms >= %s")
    c.given(s.due_before_ms, "due_ms < %s")
    return c.where()


def audit_where(s: AuditSearch) -> Where:
    """The condition on `redrive_audit` that the search means."""
    c = _Clauses()
    c.given(s.actor, "actor = %s")
    c.given(s.action, "action = %s")
    c.given(s.letter, "%s = ANY(ids)")
    c.given(s.since, "at >= %s")
    c.given(s.until, "at < %s")
    return c.where()
