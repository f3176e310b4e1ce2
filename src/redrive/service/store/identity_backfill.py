"""The identities of what was stored before intake kept them (migration 010).

A database upgraded from an older redrive has pending retries, dead letters and
delivered retries whose identities ``redrive_accepted`` does not hold: a repeat of
one of them would be stored again. Their identities are computed from their columns
(:func:`redrive.requests.failure_identity`, what the ``redrive-id`` of a request that
redrive wrote is made of) in the migration's transaction, so that no intake runs
between the new schema and its ledger.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

import psycopg
import structlog

from redrive.clock import now_ms
from redrive.records import RequestCoordinates
from redrive.requests import failure_identity
from redrive.service.migrations import Step

log = structlog.get_logger("redrive.store")

_BATCH: Final = 10_000

# Each table's failure columns, and when its identity's window starts.
_SOURCES: Final = {
    "pending": """
        SELECT group_id, original_topic, original_partition, original_offset, attempt,
               request_topic, request_partition, request_offset, greatest(due_ms, %(now)s)
        FROM redrive_pending""",
    "dead letters": """
        SELECT group_id, original_topic, original_partition, original_offset,
               coalesce(attempt, 0), request_topic, request_partition, request_offset,
               %(now)s
        FROM redrive_dead_letters
        WHERE source = 'intake' AND request_topic IS NOT NULL""",
    "history": """
        SELECT group_id, original_topic, original_partition, original_offset, attempt,
               NULL, NULL, NULL, (extract(epoch FROM delivered_at) * 1000)::bigint
        FROM redrive_history""",
}
_INSERT: Final = """
INSERT INTO redrive_accepted (identity, keep_from_ms) VALUES (%s, %s)
ON CONFLICT DO NOTHING
"""


def _identities(rows: list[tuple[Any, ...]]) -> Iterator[tuple[bytes, int]]:
    for group, topic, partition, offset, attempt, r_topic, r_partition, r_offset, keep in rows:
        if (topic is None or offset is None) and r_topic is None:
            continue  # a delivered retry that named no record: no identity to rebuild
        read_at = RequestCoordinates(r_topic or "", r_partition or 0, r_offset or 0)
        yield failure_identity(group, topic, partition, offset, attempt, read_at), keep


def fill(conn: psycopg.Connection[Any]) -> None:
    """Record the identities of every stored request (in the open transaction)."""
    now = now_ms()
    for name, query in _SOURCES.items():
        filled = 0
        with conn.cursor(name=f"redrive_backfill_{name.replace(' ', '_')}") as rows:
            rows.execute(query, {"now": now})
            while batch := rows.fetchmany(_BATCH):
                with conn.cursor() as cur:
                    cur.executemany(_INSERT, list(_identities(batch)))
                filled += len(batch)
        if filled:
            log.info("identities of stored requests recorded", table=name, rows=filled)


AFTER: Final[Mapping[int, Step]] = {10: fill}
