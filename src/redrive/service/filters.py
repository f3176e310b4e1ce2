"""Search filters for dead letters and pending retries, and their cursors.

Filters become SQL from fixed fragments with every value passed as a parameter, so
no search text can change a query. Pagination is by cursor (the sort key of the last
row seen), which stays correct while rows come and go, unlike offsets.
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class FilterError(ValueError):
    """A filter or cursor that cannot be used; the message says why."""


def _like(text: str) -> str:
    """A LIKE pattern matching `text` anywhere, with LIKE's wildcards taken literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


class DeadLetterFilter(BaseModel):
    """Which dead letters: every given field must match (AND)."""

    model_config = ConfigDict(extra="forbid")

    topic: str | None = Field(None, max_length=249)
    group: str | None = Field(None, max_length=1024)
    error_type: str | None = Field(None, max_length=1024)
    text: str | None = Field(
        None, max_length=1024, description="Found anywhere in the error message (any case)."
    )
    reason: str | None = Field(
        None, max_length=1024, description="A reason code, or text found in the reason."
    )
    since: datetime | None = Field(None, description="Dead since this time (ISO 8601).")
    until: datetime | None = Field(None, description="Dead before this time (ISO 8601).")

    @field_validator("until")
    @classmethod
    def _ordered(cls, until: datetime | None, info: Any) -> datetime | None:
        since = info.data.get("since")
        if until is not None and since is not None and until <= since:
            raise ValueError("until must be after since")
        return until

    def is_empty(self) -> bool:
        return all(v is None for v in self.model_dump().values())

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if self.topic is not None:
            clauses.append("topic = %s")
            params.append(self.topic)
        if self.group is not None:
            clauses.append("group_id = %s")
            params.append(self.group)
        if self.error_type is not None:
            clauses.append("error_type = %s")
            params.append(self.error_type)
        if self.text is not None:
            clauses.append("error_message ILIKE %s")
            params.append(_like(self.text))
        if self.reason is not None:
            clauses.append("(reason_code = %s OR reason ILIKE %s)")
            params += [self.reason, _like(self.reason)]
        if self.since is not None:
            clauses.append("dead_at >= %s")
            params.append(self.since)
        if self.until is not None:
            clauses.append("dead_at < %s")
            params.append(self.until)
        return (" AND ".join(clauses) or "TRUE"), params


class PendingFilter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    destination: str | None = Field(None, max_length=249)
    group: str | None = Field(None, max_length=1024)
    due_after_ms: int | None = Field(None, ge=0)
    due_before_ms: int | None = Field(None, ge=0)

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if self.destination is not None:
            clauses.append("destination = %s")
            params.append(self.destination)
        if self.group is not None:
            clauses.append("group_id = %s")
            params.append(self.group)
        if self.due_after_ms is not None:
            clauses.append("due_ms >= %s")
            params.append(self.due_after_ms)
        if self.due_before_ms is not None:
            clauses.append("due_ms < %s")
            params.append(self.due_before_ms)
        return (" AND ".join(clauses) or "TRUE"), params


def encode_cursor(*parts: int) -> str:
    return base64.urlsafe_b64encode(":".join(str(p) for p in parts).encode()).decode()


def decode_cursor(cursor: str, count: int) -> tuple[int, ...]:
    try:
        parts = tuple(int(p) for p in base64.urlsafe_b64decode(cursor.encode()).decode().split(":"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise FilterError(f"cursor {cursor[:40]!r} is not one this API returned") from exc
    if len(parts) != count:
        raise FilterError(f"cursor {cursor[:40]!r} is not one this API returned")
    return parts
