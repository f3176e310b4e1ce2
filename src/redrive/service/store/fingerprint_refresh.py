"""The error groups computed again after their rules changed (migration 017).

Every letter's fingerprint is computed again in Python
(:func:`redrive.service.fingerprints.group_of`, as the store does for a new letter),
a batch at a time, read by a server-side cursor and set by one UPDATE per batch, as
:mod:`.error_group_backfill` does. What operators did to the old groups is kept:

- a letter in its own group (its group was its fingerprint) is in its new one;
- a letter an operator moved stays with the letters of the group it was moved to,
  when those are still one group; if the new rules split that group, it goes to its
  own new group (no group of the split is more its group than another);
- a group that was muted: every group its letters are in now is muted, by the same
  operator.
"""

from __future__ import annotations

from collections import defaultdict
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
SELECT id, fingerprint, error_group, error_type, error_message, error_trace, reason_code,
       reason
FROM redrive_dead_letters WHERE fingerprint IS NOT NULL
"""
# A letter in its own group follows its fingerprint; a moved one keeps its group here
# (set once every group's new fingerprint is known).
_SET: Final = """
UPDATE redrive_dead_letters d
SET fingerprint = s.fingerprint,
    error_group = CASE WHEN d.error_group = d.fingerprint THEN s.fingerprint
                       ELSE d.error_group END
FROM unnest(%s::bigint[], %s::text[]) AS s(id, fingerprint) WHERE d.id = s.id
"""
_MOVED_TO: Final = """
UPDATE redrive_dead_letters SET error_group = %s
WHERE error_group = %s AND error_group <> fingerprint
"""
_MOVED_TO_SPLIT: Final = """
UPDATE redrive_dead_letters SET error_group = fingerprint
WHERE error_group = %s AND error_group <> fingerprint
"""
_MUTE: Final = """
UPDATE redrive_error_groups n SET muted = true, muted_by = o.muted_by, muted_at = o.muted_at
FROM redrive_error_groups o
WHERE o.error_group = %s AND o.muted AND n.error_group = ANY(%s)
"""
_UNUSED: Final = """
DELETE FROM redrive_error_groups g
WHERE NOT EXISTS (SELECT 1 FROM redrive_dead_letters d WHERE d.error_group = g.error_group)
"""


def refresh(conn: psycopg.Connection[Any]) -> None:
    """Compute every letter's fingerprint again; keep moves and mutes (module)."""
    became: dict[str, set[str]] = defaultdict(set)  # old group: the new groups of its letters
    letters = 0
    with conn.cursor(name="redrive_refresh_fingerprints") as rows, conn.cursor() as cur:
        rows.itersize = BATCH
        rows.execute(_READ)
        while batch := rows.fetchmany(BATCH):
            groupings = [grouping_of(*row[3:]) for row in batch]
            record_groups(cur, groupings)
            for (_, old, group, *_), grouping in zip(batch, groupings, strict=True):
                if group == old:
                    became[old].add(grouping.fingerprint)
            ids = id_array(row[0] for row in batch)
            cur.execute(_SET, (ids, [g.fingerprint for g in groupings]))
            letters += len(batch)
        for old, new in became.items():
            if len(new) == 1:
                cur.execute(_MOVED_TO, (next(iter(new)), old))
            else:
                cur.execute(_MOVED_TO_SPLIT, (old,))
            cur.execute(_MUTE, (old, sorted(new)))
        cur.execute(_UNUSED)
    if letters:
        log.info("error groups of stored dead letters computed again", letters=letters)


AFTER: Final[Mapping[int, Step]] = {17: refresh}
