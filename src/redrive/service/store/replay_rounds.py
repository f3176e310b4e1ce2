"""The loop guard's record: each replay of a dead letter (a round), and what came back.

A replayed copy carries ``redrive-replays`` (the letter's count + 1) and
``redrive-replay-of`` (the letter's id); when it comes back dead, its letter names
both, and the trigger of migration 013 closes the round it came back from (which
letter, when, with which error: copied, since that letter may be replayed and deleted
in its turn). Rounds are recorded in the transaction that settles the replay (a
job's batch as its Kafka transaction is recorded committed; a single replay once the
broker acknowledged it), before the letter may be deleted. ``first_id`` names the
first letter of a line of rounds, so a letter's story finds every round of its line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import psycopg
from psycopg.rows import dict_row

from redrive.service.store.read_models import ReplayRound

# The first letter of the line a letter belongs to: that of the round it came back
# from, else the letter itself.
_FIRST: Final = (
    "COALESCE((SELECT r.first_id FROM redrive_replay_rounds r"
    " WHERE r.returned_id = d.id ORDER BY r.id LIMIT 1), d.id)"
)

_RECORD_ONE: Final = f"""
INSERT INTO redrive_replay_rounds (letter_id, first_id, round, actor, topic, kafka_partition)
SELECT d.id, {_FIRST}, d.replays + 1, %s, %s, %s FROM redrive_dead_letters d WHERE d.id = %s
"""

_RECORD_BATCH: Final = f"""
INSERT INTO redrive_replay_rounds
    (letter_id, first_id, round, actor, job_id, topic, kafka_partition)
SELECT d.id, {_FIRST}, d.replays + 1, j.actor, j.id, i.topic, i.kafka_partition
FROM redrive_replay_job_items i
JOIN redrive_replay_jobs j ON j.id = i.job_id
JOIN redrive_dead_letters d ON d.id = i.dead_letter_id
WHERE i.job_id = %s AND i.state = 'sending'
"""

# The line of each asked letter: the first letter of the round it came back from, or
# of a round it was replayed in; letters in no round have none.
_OF_LETTERS: Final = """
WITH lines AS (
  SELECT a.id AS asked, COALESCE(
    (SELECT r.first_id FROM redrive_replay_rounds r WHERE r.returned_id = a.id
      ORDER BY r.id LIMIT 1),
    (SELECT r.first_id FROM redrive_replay_rounds r WHERE r.letter_id = a.id
      ORDER BY r.id LIMIT 1)) AS first_id
  FROM unnest(%s::bigint[]) AS a(id)
)
SELECT l.asked, r.id, r.letter_id, r.round, r.replayed_at, r.actor, r.job_id, r.topic,
       r.kafka_partition, r.returned_id, r.returned_at, r.error_type, r.error_message
FROM lines l
CROSS JOIN LATERAL (SELECT * FROM redrive_replay_rounds r WHERE r.first_id = l.first_id
                    ORDER BY r.id LIMIT %s) r
ORDER BY l.asked, r.id
"""

MAX_ROUNDS: Final = 100
"""The most rounds a line shows (the loop guard stops bulk replays after a few)."""


def record_one(
    conn: psycopg.Connection[Any], letter_id: int, *, actor: str, topic: str, partition: int | None
) -> None:
    """A single replay of the letter, acknowledged by the broker (before it may be
    deleted)."""
    conn.execute(_RECORD_ONE, (actor, topic, partition, letter_id))


def record_batch(conn: psycopg.Connection[Any], job_id: int) -> None:
    """The job's batch being settled as committed (its items still `sending`)."""
    conn.execute(_RECORD_BATCH, (job_id,))


def of_letters(
    conn: psycopg.Connection[Any], letter_ids: Sequence[int]
) -> dict[int, list[ReplayRound]]:
    """Every round of the line each letter belongs to, first first (also for a letter
    that is gone: replayed and deleted); letters in no round are left out."""
    found: dict[int, list[ReplayRound]] = {}
    with conn.cursor(row_factory=dict_row) as cur:
        for row in cur.execute(_OF_LETTERS, (list(letter_ids), MAX_ROUNDS)).fetchall():
            asked = row.pop("asked")
            found.setdefault(int(asked), []).append(ReplayRound(**row))
    return found
