"""The error groups of the dead letters stored before letters had one (migration 012).

A database upgraded from an older redrive has letters without a fingerprint. Theirs
are computed in Python (:func:`redrive.service.fingerprints.group_of`, as the store
does for a new letter) in the migration's transaction, a batch at a time: the
batch's letters are read by a server-side cursor, and their fingerprints set by one
UPDATE joined to the batch's ids and fingerprints sent as two arrays (which the
planner takes as a few rows: each letter found by its primary key, never a scan of
the table per batch). The index on the groups is made once every letter has its
group, which costs less than keeping it up to date.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import psycopg
import structlog

from redrive.service.migrations import Step
from redrive.service.store.error_groups import grouping_of, record_groups
from redrive.service.store.rows import id_array

log = structlog.get_logger("redrive.store")

BATCH: Final = 20_000

_READ: Final = """
SELECT id, error_type, error_message, error_trace, reason_code, reason
FROM redrive_dead_letters WHERE fingerprint IS NULL
"""
_SET: Final = """
UPDATE redrive_dead_letters d SET fingerprint = s.fingerprint, error_group = s.fingerprint
FROM unnest(%s::bigint[], %s::text[]) AS s(id, fingerprint) WHERE d.id = s.id
"""
# Group queries: a group's letters newest first, and its figures read from the index
# alone (topic and consumer group included).
_INDEX: Final = """
CREATE INDEX redrive_dead_letters_error_group_ix
    ON redrive_dead_letters (error_group, dead_at DESC) INCLUDE (topic, group_id)
"""


def fill(conn: psycopg.Connection[Any]) -> None:
    """Give every letter without one its fingerprint and group, then index them."""
    filled = 0
    with conn.cursor(name="redrive_backfill_fingerprints") as rows, conn.cursor() as cur:
        rows.itersize = BATCH
        rows.execute(_READ)
        while batch := rows.fetchmany(BATCH):
            groupings = [grouping_of(*row[1:]) for row in batch]
            record_groups(cur, groupings)
            ids = id_array(row[0] for row in batch)
            cur.execute(_SET, (ids, [g.fingerprint for g in groupings]))
            filled += len(batch)
    conn.execute(_INDEX)
    conn.execute("ANALYZE redrive_dead_letters")
    if filled:
        log.info("error groups of stored dead letters computed", letters=filled)


AFTER: Final[Mapping[int, Step]] = {12: fill}
