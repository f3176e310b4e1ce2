"""Intake hands its partitions over with every stored request committed.

When another instance joins, the partitions it takes must come with their offsets
committed past every request already stored; otherwise it reads those requests
again, and any already delivered (and so gone from the unique index) would be
delivered twice. The batch being stored when the rebalance comes is waited for.
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
            due = now_ms()
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
            committed = joiner.committed(taken, timeout=10)
            ends = [joiner.get_watermark_offsets(tp, timeout=10)[1] for tp in taken]
    finally:
        joiner.close()
        first.terminate()
    assert sum(ends) > 0, "the joiner took only empty partitions: the test proves nothing"
    behind = {
        tp.partition: end - max(c.offset, 0)
        for tp, c, end in zip(taken, committed, ends, strict=True)
        if end - max(c.offset, 0) > 0
    }
    assert behind == {}, f"handed over with stored requests uncommitted: {behind}"
    log = (tmp_path / "first.log").read_text()
    assert "partitions revoked" in log
