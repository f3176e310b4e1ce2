"""Benchmark 8: error groups at a million dead letters.

A database at the schema before error groups (migration 11) is filled with `n` dead
letters by COPY: 200 failures (40 error types, each with five messages), every
message with ids, numbers, UUIDs and quoted values of its own, half of them with a
Python or JVM stack trace, spread over the last 24 hours. Migration 12 is then
timed (the fingerprints computed in Python and written back in batches, the index
made): letters per second. Then the reads at that size, each the best of three: the
groups list (the 50 largest, with their sparklines), a page of one group's letters,
and the surge figures a scrape reads.
"""

from __future__ import annotations

import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from redrive.service.filters import DeadLetterFilter
from redrive.service.migrations import migrate
from redrive.service.store import MIGRATION_STEPS, Store

TYPES = 40
MESSAGES = (
    "order {n} not found for customer {email}",
    "gateway {uuid} timed out after {n} ms",
    "sku '{word}-{n}' has no price in list {n}",
    "Expecting value: line {n} column {n} (char {n})",
    "connection to db-{n}:5432 refused (attempt {n} of 5)",
)
PY_TRACE = """Traceback (most recent call last):
  File "/usr/lib/python3.12/site-packages/redrive/consumer/pipeline.py", line 210, in run
    outcome = handler(message)
  File "/srv/app/orders/handlers{t}.py", line {n}, in handle
    price = lookup(message.value)
  File "/usr/lib/python3.12/json/__init__.py", line 346, in loads
    return _default_decoder.decode(s)
"""
JVM_TRACE = """\tat java.base/java.util.Optional.orElseThrow(Optional.java:403)
\tat com.example.prices.PriceListener{t}.onMessage(PriceListener.java:{n})
\tat org.springframework.kafka.listener.KafkaMessageListenerContainer.invoke(K.java:{n})
"""
COLUMNS = (
    "topic, headers, attempt, group_id, error_type, error_message, error_trace, "
    "reason_code, reason, source, request_topic, request_partition, request_offset, dead_at"
)
TYPES_OF = ["text", "bytea", "int4", "text", "text", "text", "text", "text", "text", "text",
            "text", "int4", "int8", "timestamptz"]  # fmt: skip


def _row(rng: random.Random, i: int, now: datetime) -> tuple[Any, ...]:
    t = rng.randrange(TYPES)
    n = rng.randrange(10**9)
    message = MESSAGES[rng.randrange(len(MESSAGES))].format(
        n=n, email=f"c{n}@example.com", uuid=uuid.UUID(int=rng.getrandbits(128)), word="SKU"
    )
    trace = None
    if i % 2:
        trace = (PY_TRACE if t % 2 else JVM_TRACE).format(t=t, n=rng.randrange(1000))
    return (
        f"orders-{t % 8}",
        b"\x90",
        3,
        f"billing-{t % 5}",
        f"app.errors.Failure{t}",
        message,
        trace,
        "attempts_exhausted",
        "attempts exhausted (3 of 3)",
        "intake",
        "redrive.requests",
        0,
        i,
        now - timedelta(seconds=rng.randrange(86_400)),
    )


def fill(url: str, n: int) -> float:
    """`n` letters at schema 11, by COPY; seconds taken."""
    rng = random.Random(8)
    now = datetime.now(UTC)
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn, up_to=11)
        with (
            conn.cursor() as cur,
            cur.copy(f"COPY redrive_dead_letters ({COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy,
        ):
            copy.set_types(TYPES_OF)
            for i in range(n):
                copy.write_row(_row(rng, i, now))
        conn.execute("VACUUM ANALYZE redrive_dead_letters")
    return time.perf_counter() - started


def _best_ms(call: Any, rounds: int = 3) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def run(server_url: str, n: int, fresh_database: Any) -> dict[str, Any]:
    url = fresh_database(server_url)
    fill_s = fill(url, n)
    print(f"filled {n} dead letters at schema 11 in {fill_s:.1f}s")
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        applied = migrate(conn, up_to=12, after=MIGRATION_STEPS)
        migrate_s = time.perf_counter() - started
        assert applied == ["012_error_groups"], applied
        conn.execute("VACUUM ANALYZE redrive_dead_letters")
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE error_group IS NULL), count(DISTINCT error_group)"
            " FROM redrive_dead_letters"
        ).fetchone()
        assert row is not None
        assert row[0] == 0, "letters left without a group"
        groups = int(row[1])
    store = Store(url)
    store.open()
    try:
        listed = store.error_groups(limit=50)
        largest = listed[0].error_group
        list_ms = _best_ms(lambda: store.error_groups(limit=50))
        by_last_seen_ms = _best_ms(lambda: store.error_groups(order="last_seen", limit=50))
        letters_ms = _best_ms(
            lambda: store.find_dead_letters(DeadLetterFilter(error_group=largest), limit=51)
        )
        surges_ms = _best_ms(lambda: store.error_group_surges(limit=50))
    finally:
        store.close()
    return {
        "n": n,
        "groups": groups,
        "migrate_s": migrate_s,
        "letters_per_s": n / migrate_s,
        "list_ms": list_ms,
        "list_by_last_seen_ms": by_last_seen_ms,
        "group_page_ms": letters_ms,
        "surges_ms": surges_ms,
    }
