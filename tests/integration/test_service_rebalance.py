"""Intake hands its partitions over with every stored request committed.

When another instance joins, the partitions it takes must come with their offsets
committed past every request already stored; otherwise it reads those requests
again, and any already delivered (and so gone from the unique index) would be
delivered twice. The batch being stored when the rebalance comes is waited for.
Requests intake had not read when the rebalance came are the joiner's to read.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer

from redrive.deadlines import Deadline
from tests.integration.service_harness import (
    ServiceProcess,
    fresh_database,
    now_ms,
    produce,
    request_headers,
    settings_for,
)

pytestmark = pytest.mark.integration


def _storing_waits(url: str) -> bool:
    """Whether an intake insert is waiting for a lock (the test's, below)."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND query LIKE 'COPY redrive_pending%'"
        ).fetchone()
    return bool(row and row[0])


def _stored(url: str, topic: str) -> dict[int, int]:
    """The highest offset of each partition of ``topic`` that intake stored."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT request_partition, max(request_offset) FROM redrive_pending"
            " WHERE request_topic = %s GROUP BY request_partition",
            (topic,),
        ).fetchall()
    return {partition: offset for partition, offset in rows}


def _settled(url: str, topic: str, timeout_s: float) -> dict[int, int]:
    """What intake stored, once no insert waits and two looks a second apart agree."""
    deadline = Deadline(timeout_s)
    before = None
    while True:
        now = None if _storing_waits(url) else _stored(url, topic)
        if now is not None and now == before:
            return now
        assert not deadline.passed(), "intake's stores never settled"
        before = now
        time.sleep(1)


def test_partitions_are_handed_over_with_the_batch_being_stored_committed(
    bootstrap: str, database_url: str, new_topic: Any, tmp_path: Path
) -> None:
    destination = new_topic("handover", partitions=1)
    db = fresh_database(database_url)
    # The first instance notices a rebalance within half a second.
    fast = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"}
    settings = settings_for(bootstrap, db, allowed_destinations=[destination], kafka=fast)
    first = ServiceProcess(settings, tmp_path / "first.log")
    first.start()
    joiner = Consumer({"bootstrap.servers": bootstrap, "group.id": settings.group_id, **fast})
    try:
        with psycopg.connect(db) as blocker:
            # Hold intake's next insert: its batch is read but not yet stored.
            blocker.execute("LOCK TABLE redrive_pending IN SHARE ROW EXCLUSIVE MODE")
            # Due in an hour: the stored requests stay in the table, where the test
            # reads their offsets.
            due = now_ms() + 3_600_000
            records = [
                {
                    "key": f"k{i}".encode(),
                    "value": b"v",
                    "headers": request_headers(destination, due),
                }
                for i in range(60)
            ]
            produce(bootstrap, settings.requests_topic, records)
            deadline = Deadline(60)
            while not _storing_waits(db):
                assert not deadline.passed(), "intake never started storing the batch"
                time.sleep(0.1)
            # Another member joins while the batch waits. The first instance must not
            # give up its partitions before the batch is stored and committed: the
            # insert is let go 4 s on, well after the rebalance began, but the joiner
            # must not be assigned before.
            joiner.subscribe([settings.requests_topic])
            joined = time.monotonic()
            deadline = Deadline(60)
            while not joiner.assignment():
                assert not deadline.passed(), "the joiner was never assigned"
                joiner.poll(0.1)
                if blocker.info.transaction_status and time.monotonic() - joined > 4:
                    blocker.commit()
            taken = joiner.assignment()
            committed = {c.partition: c.offset for c in joiner.committed(taken, timeout=10)}
            if blocker.info.transaction_status:
                blocker.commit()
        # Had the first instance let its partitions go before storing the batch, the
        # insert it waited on would store them now: look once it has finished.
        stored = _settled(db, settings.requests_topic, 60)
    finally:
        joiner.close()
        first.terminate()
    # Records intake had not read yet may be left to the joiner: they were never stored.
    # What was stored must be behind every committed offset the joiner starts from.
    handed = {p: stored[p] for p in committed if p in stored}
    assert handed, "the joiner took no partition with a stored request: the test proves nothing"
    behind = {p: (committed[p], last) for p, last in handed.items() if committed[p] <= last}
    assert behind == {}, f"handed over with stored requests uncommitted: {behind}"
    log = (tmp_path / "first.log").read_text()
    assert "partitions revoked" in log
