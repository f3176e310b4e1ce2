"""Wakes the scheduler when another instance's intake stores an earlier retry.

Intake sends `NOTIFY redrive_pending, '<earliest due ms>'` in the transaction that
stores a batch; this listener holds a LISTEN connection and passes each due time to
the scheduler. After every (re)connection it wakes the scheduler once, since
notifications sent while it was disconnected are lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg
import structlog

from redrive.schedules import backoff_delay
from redrive.service.store import NOTIFY_CHANNEL

log = structlog.get_logger("redrive.notify")


def listen(database_url: str, wake: Callable[[int], None], stop: threading.Event) -> None:
    failures = 0
    while not stop.is_set():
        try:
            with psycopg.connect(database_url, autocommit=True, connect_timeout=5) as conn:
                conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                failures = 0
                wake(0)
                while not stop.is_set():
                    for note in conn.notifies(timeout=0.5):
                        try:
                            wake(int(note.payload))
                        except ValueError:
                            wake(0)
        except psycopg.OperationalError as exc:
            failures += 1
            log.warning(
                "notification listener disconnected", error=str(exc).strip(), attempt=failures
            )
            stop.wait(backoff_delay(failures + 1, 0.2, 10.0))
