"""The per-minute counters and the totals an operator's dashboard shows.

Every change that schedules, delivers or dead-letters messages counts them in
`redrive_stats_minute`, per minute, kind and topic, in its own transaction (so a
count never disagrees with what happened); the reads here sum them up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import psycopg

from redrive.service.store.rows import clean_text

KINDS: Final = ("scheduled", "published", "dead_lettered")

COUNT_MINUTE: Final = """
INSERT INTO redrive_stats_minute (minute, kind, topic, count)
VALUES (date_trunc('minute', now()), %s, %s, %s)
ON CONFLICT (minute, kind, topic)
DO UPDATE SET count = redrive_stats_minute.count + EXCLUDED.count
"""

_RATES = """
WITH span AS (
    SELECT generate_series(date_trunc('minute', now()) - (%s - 1) * interval '1 minute',
                           date_trunc('minute', now()), interval '1 minute') AS minute)
SELECT span.minute, kinds.kind, coalesce(sum(s.count), 0)
FROM span CROSS JOIN (VALUES ('scheduled'), ('published'), ('dead_lettered')) kinds(kind)
LEFT JOIN redrive_stats_minute s ON s.minute = span.minute AND s.kind = kinds.kind
GROUP BY span.minute, kinds.kind ORDER BY span.minute
"""


def per_topic(topics: Sequence[str | None]) -> list[tuple[str, int]]:
    """How many of each topic, as the counters key them (no topic: "")."""
    counts: dict[str, int] = {}
    for topic in topics:
        key = clean_text(topic) or ""
        counts[key] = counts.get(key, 0) + 1
    return sorted(counts.items())


def _total(conn: psycopg.Connection[Any], sql: str) -> int:
    row = conn.execute(sql.encode()).fetchone()
    return int(row[0]) if row else 0


def _grouped(conn: psycopg.Connection[Any], sql: str) -> list[dict[str, Any]]:
    return [{"key": r[0], "count": int(r[1])} for r in conn.execute(sql.encode())]


def totals(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Dead letters and pending retries now: totals and the 50 largest groups of each."""

    def top(column: str, table: str) -> list[dict[str, Any]]:
        return _grouped(
            conn, f"SELECT {column}, count(*) FROM {table} GROUP BY 1 ORDER BY 2 DESC LIMIT 50"
        )

    return {
        "dead_letters": {
            "total": _total(conn, "SELECT count(*) FROM redrive_dead_letters"),
            "by_topic": top("coalesce(topic, '')", "redrive_dead_letters"),
            "by_group": top("coalesce(group_id, '')", "redrive_dead_letters"),
            "by_error_type": top("coalesce(error_type, '')", "redrive_dead_letters"),
            "by_reason": top("reason_code", "redrive_dead_letters"),
        },
        "pending": {
            "total": _total(conn, "SELECT count(*) FROM redrive_pending"),
            "by_destination": top("destination", "redrive_pending"),
        },
    }


def rates(conn: psycopg.Connection[Any], minutes: int) -> dict[str, list[dict[str, Any]]]:
    """Per-minute counts of the last `minutes` minutes, by kind (all topics summed),
    with zero for quiet minutes, oldest first."""
    series: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    for minute, kind, count in conn.execute(_RATES.encode(), (minutes,)):
        series[kind].append({"minute": minute.isoformat(), "count": int(count)})
    return series
