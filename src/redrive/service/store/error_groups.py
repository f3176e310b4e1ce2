"""Error groups' SQL: the groups of dead letters, their state, a letter moved.

A letter's ``fingerprint`` is computed once, when it is stored
(:func:`redrive.service.fingerprints.group_of`: :func:`grouping_of` here), and never
changes; its ``error_group`` is the group it is in: its fingerprint, unless an
operator moved it. ``redrive_error_groups`` holds a row per group ever seen: its
title and whether it is muted. Invariant: every letter's ``error_group`` has its row
there (made in the transaction that stores the letter, or that moves it).

A group's figures (count, first and last seen, topics, consumer groups, the hourly
counts) are counted from its letters when asked; a group whose letters are all gone
is not listed, but keeps its state (muted stays muted if it comes back).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

import psycopg
from psycopg.rows import dict_row

from redrive.service.fingerprints import Failure, Grouping, group_of
from redrive.service.store.read_models import ErrorGroup, GroupSurge

SPARKLINE_HOURS: Final = 24
MAX_NAMES: Final = 20
"""Topics and consumer groups named per group at most (the first, by name)."""

_RECORD_GROUPS: Final = """
INSERT INTO redrive_error_groups (error_group, title)
SELECT * FROM unnest(%s::text[], %s::text[]) ON CONFLICT DO NOTHING
"""

# Counted in two steps: the letters by (group, topic, consumer group) first, which
# PostgreSQL hashes in one pass, then those few rows by group.
_GROUPS: Final = f"""
WITH parts AS (
    SELECT error_group, topic, group_id, count(*) AS n,
           min(dead_at) AS first_seen, max(dead_at) AS last_seen
    FROM redrive_dead_letters WHERE error_group IS NOT NULL AND {{letters}}
    GROUP BY error_group, topic, group_id
), groups AS (
    SELECT error_group, sum(n)::bigint AS count, min(first_seen) AS first_seen,
           max(last_seen) AS last_seen,
           (array_agg(DISTINCT topic ORDER BY topic)
               FILTER (WHERE topic IS NOT NULL))[1:{MAX_NAMES}] AS topics,
           (array_agg(DISTINCT group_id ORDER BY group_id)
               FILTER (WHERE group_id IS NOT NULL))[1:{MAX_NAMES}] AS consumer_groups
    FROM parts GROUP BY error_group
)
SELECT s.error_group, coalesce(g.title, s.error_group) AS title,
       coalesce(g.muted, false) AS muted, g.muted_by, g.muted_at, s.count,
       s.first_seen, s.last_seen, coalesce(s.topics, ARRAY[]::text[]) AS topics,
       coalesce(s.consumer_groups, ARRAY[]::text[]) AS consumer_groups
FROM groups s LEFT JOIN redrive_error_groups g USING (error_group)
WHERE {{state}}
ORDER BY {{order}} LIMIT %(limit)s
"""
ORDERS: Final = {
    "count": "s.count DESC, s.error_group",
    "last_seen": "s.last_seen DESC, s.error_group",
}

_HOURLY: Final = """
SELECT error_group, floor(extract(epoch FROM %(until)s - dead_at) / 3600)::int AS ago, count(*)
FROM redrive_dead_letters
WHERE error_group = ANY(%(groups)s) AND dead_at > %(until)s - interval '24 hours'
  AND dead_at <= %(until)s
GROUP BY 1, 2
"""

_MOVE: Final = """
UPDATE redrive_dead_letters d SET error_group = %(to)s
FROM (SELECT id, error_group FROM redrive_dead_letters WHERE id = %(id)s FOR UPDATE) o
WHERE d.id = o.id
RETURNING o.error_group
"""

_SURGES: Final = """
SELECT d.error_group, coalesce(g.muted, false) AS muted,
       count(*) FILTER (WHERE d.dead_at > %(now)s - interval '1 hour') AS last_hour,
       count(*) FILTER (WHERE d.dead_at <= %(now)s - interval '1 hour') AS before
FROM redrive_dead_letters d LEFT JOIN redrive_error_groups g USING (error_group)
WHERE d.dead_at > %(now)s - interval '25 hours' AND d.error_group IS NOT NULL
  AND d.replay_of IS NULL
GROUP BY d.error_group, g.muted
HAVING count(*) FILTER (WHERE d.dead_at > %(now)s - interval '1 hour') > 0
ORDER BY last_hour DESC, d.error_group LIMIT %(limit)s
"""


def grouping_of(
    error_type: str | None,
    error_message: str | None,
    error_trace: str | None,
    reason_code: str,
    reason: str | None,
) -> Grouping:
    """The group of a letter with these columns."""
    return group_of(Failure(error_type, error_message, error_trace, reason_code, reason))


def record_groups(cur: psycopg.Cursor[Any], groupings: Iterable[Grouping]) -> None:
    """Make the rows of the groups not seen before (in the open transaction)."""
    titles = {g.fingerprint: g.title for g in groupings}
    if titles:
        cur.execute(_RECORD_GROUPS, (list(titles), list(titles.values())))


def _figures(
    conn: psycopg.Connection[Any],
    *,
    letters: str = "TRUE",
    state: str = "TRUE",
    order: str = "count",
    params: dict[str, Any],
    now: datetime | None = None,
) -> list[ErrorGroup]:
    sql = _GROUPS.format(letters=letters, state=state, order=ORDERS[order])
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(sql.encode(), params).fetchall()
    hourly = _hourly(conn, [r["error_group"] for r in rows], now or datetime.now(UTC))
    return [
        ErrorGroup(
            **{
                **row,
                "topics": tuple(row["topics"]),
                "consumer_groups": tuple(row["consumer_groups"]),
            },
            hourly=hourly.get(row["error_group"], (0,) * SPARKLINE_HOURS),
        )
        for row in rows
    ]


def _hourly(
    conn: psycopg.Connection[Any], groups: Sequence[str], until: datetime
) -> dict[str, tuple[int, ...]]:
    """Each group's letters in each of the last 24 hours, oldest hour first."""
    if not groups:
        return {}
    counts: dict[str, list[int]] = {g: [0] * SPARKLINE_HOURS for g in groups}
    rows = conn.execute(_HOURLY, {"groups": list(groups), "until": until}).fetchall()
    for group, ago, count in rows:
        if 0 <= ago < SPARKLINE_HOURS:
            counts[group][SPARKLINE_HOURS - 1 - ago] = int(count)
    return {g: tuple(c) for g, c in counts.items()}


def listed(
    conn: psycopg.Connection[Any],
    *,
    order: str,
    topic: str | None,
    muted: bool | None,
    limit: int,
) -> list[ErrorGroup]:
    """Up to ``limit`` groups with letters, by count or last seen; those with letters on
    ``topic`` (counting all their letters), muted or not when asked."""
    letters = "TRUE"
    if topic is not None:
        letters = (
            "error_group IN (SELECT error_group FROM redrive_dead_letters WHERE topic = %(topic)s)"
        )
    state = "TRUE" if muted is None else "coalesce(g.muted, false) = %(muted)s"
    params = {"topic": topic, "muted": muted, "limit": limit}
    return _figures(conn, letters=letters, state=state, order=order, params=params)


def one(conn: psycopg.Connection[Any], error_group: str) -> ErrorGroup | None:
    """The group with its figures; None if it has no letter (or never had)."""
    found = _figures(
        conn, letters="error_group = %(group)s", params={"group": error_group, "limit": 1}
    )
    return found[0] if found else None


def exists(conn: psycopg.Connection[Any], error_group: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM redrive_error_groups WHERE error_group = %s", (error_group,)
    ).fetchone()
    return row is not None


def mute(conn: psycopg.Connection[Any], error_group: str, *, muted: bool, by: str) -> bool | None:
    """Mute or unmute a group; its state before (None: no such group)."""
    row = conn.execute(
        "UPDATE redrive_error_groups g SET muted = %s, muted_by = %s, muted_at = now()"
        " FROM (SELECT error_group, muted FROM redrive_error_groups WHERE error_group = %s"
        " FOR UPDATE) o WHERE g.error_group = o.error_group RETURNING o.muted",
        (muted, by if muted else None, error_group),
    ).fetchone()
    return None if row is None else bool(row[0])


def move(conn: psycopg.Connection[Any], letter_id: int, to: str) -> str | None:
    """Put a letter in the group ``to`` (which exists); the group it was in, or None
    if there is no such letter. Its fingerprint is kept."""
    row = conn.execute(_MOVE, {"id": letter_id, "to": to}).fetchone()
    return None if row is None else row[0]


def surges(
    conn: psycopg.Connection[Any], *, limit: int, now: datetime | None = None
) -> list[GroupSurge]:
    """The ``limit`` groups with the most letters in the last hour, with how many came
    in the 24 hours before it. A letter that came back dead from a replay is not
    counted: it is an earlier failure seen again, not a new one."""
    now = now or datetime.now(UTC)
    rows = conn.execute(_SURGES, {"now": now, "limit": limit}).fetchall()
    return [
        GroupSurge(error_group=g, muted=bool(m), last_hour=int(n), usual_per_hour=int(b) / 24)
        for g, m, n, b in rows
    ]
