"""The audit log: who did what to which messages, newest first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import class_row

from redrive.service.store.read_models import AuditRecord
from redrive.service.store.searches import AuditSearch, audit_where


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One operator action: who (actor, role), what, on which ids or which filter."""

    actor: str
    role: str
    action: str
    ids: Sequence[int]
    filter_json: str | None
    count: int
    detail_json: str | None


def append(conn: psycopg.Connection[Any], entry: AuditEntry) -> None:
    conn.execute(
        "INSERT INTO redrive_audit (actor, role, action, ids, filter, count, detail)"
        " VALUES (%s, %s, %s, %s, %s::jsonb, %s, %s::jsonb)",
        (
            entry.actor,
            entry.role,
            entry.action,
            list(entry.ids),
            entry.filter_json,
            entry.count,
            entry.detail_json,
        ),
    )


def newest(
    conn: psycopg.Connection[Any], search: AuditSearch, *, before_id: int | None, limit: int
) -> list[AuditRecord]:
    """Up to `limit` entries `search` matches, newest first, older than `before_id`."""
    where, params = audit_where(search)
    if before_id is not None:
        where, params = f"{where} AND id < %s", [*params, before_id]
    with conn.cursor(row_factory=class_row(AuditRecord)) as cur:
        return cur.execute(
            f"SELECT id, at, actor, role, action, ids, filter, count, detail "
            f"FROM redrive_audit WHERE {where} ORDER BY id DESC LIMIT %s".encode(),
            [*params, limit],
        ).fetchall()
