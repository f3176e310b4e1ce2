"""Waking the schedulers: a write that makes a retry due sooner says so.

Schedulers sleep until their next due row; one that another instance (or an
operator) makes due earlier would wait out that sleep. A write that does so sends
``NOTIFY redrive_pending, '<due ms>'`` in its own transaction, so the news arrives
when the rows are visible (:mod:`redrive.service.notify` listens).
"""

from __future__ import annotations

from typing import Any, Final

import psycopg

NOTIFY_CHANNEL: Final = "redrive_pending"
"""Where a write that makes a retry due sooner says so (payload: its due time, ms)."""


def notify_due(conn: psycopg.Connection[Any], due_ms: int) -> None:
    """Tell every scheduler, at the commit of the open transaction, that something is
    due at ``due_ms``."""
    conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, str(due_ms)))
