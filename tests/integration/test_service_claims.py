"""Schedulers' claims on the store: row locks that share the work and free up on failure.

These talk to a real PostgreSQL: two Store objects stand for two service instances.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from redrive.reasons import DeadLetterReason
from redrive.records import PendingRetry, RequestCoordinates
from redrive.requests import identity
from redrive.service.store import Settlement, Store
from tests.integration.service_harness import fresh_database, now_ms

pytestmark = pytest.mark.integration


def _pending(n: int, due_ms: int) -> list[PendingRetry]:
    return [
        PendingRetry(
            due_ms=due_ms + i,
            destination="orders",
            partition=None,
            key=f"k{i}".encode(),
            value=b"v",
            headers=[("trace", b"\x00\x01")],
            attempt=1,
            group=None,
            deadline_ms=None,
            original_topic=None,
            original_partition=None,
            original_offset=None,
            request=RequestCoordinates("redrive.requests", 0, i),
            identity=identity(None, RequestCoordinates("redrive.requests", 0, i)),
        )
        for i in range(n)
    ]


def _store(url: str, **kwargs: float) -> Store:
    store = Store(url, **kwargs)
    store.open()
    return store


def _pending_ids(url: str) -> set[int]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM redrive_pending").fetchall()}


def test_two_claims_never_share_a_row_and_settled_rows_are_gone(database_url: str) -> None:
    url = fresh_database(database_url)
    a, b = _store(url), _store(url)
    try:
        a.insert_batch(_pending(10, now_ms() - 1_000), (), now_ms=now_ms())
        with a.claim_due(now_ms=now_ms(), limit=6) as first:
            with b.claim_due(now_ms=now_ms(), limit=100) as second:
                assert len(first.rows) == 6
                assert len(second.rows) == 4, "the other instance takes only the free rows"
                assert not {r.id for r in first.rows} & {r.id for r in second.rows}
                assert [r.due_ms for r in first.rows] == sorted(r.due_ms for r in first.rows)
                assert first.rows[0].headers == [("trace", b"\x00\x01")]
                second.settle(Settlement(delivered=[r.id for r in second.rows]))
            # While the first claim is open, nobody can see its rows as next due.
            assert b.next_wake_ms() is None
            first.settle(Settlement(delivered=[r.id for r in first.rows]))
        assert _pending_ids(url) == set()
    finally:
        a.close()
        b.close()


def test_a_claim_that_fails_gives_its_rows_back_at_once(database_url: str) -> None:
    url = fresh_database(database_url)
    a, b = _store(url), _store(url)
    try:
        a.insert_batch(_pending(3, now_ms() - 1_000), (), now_ms=now_ms())
        claimed = []

        def fail_mid_claim() -> None:
            with a.claim_due(now_ms=now_ms(), limit=10) as claim:
                claimed.extend(claim.rows)
                raise RuntimeError("the broker refused; nothing settled")

        with pytest.raises(RuntimeError):
            fail_mid_claim()
        assert len(claimed) == 3
        with b.claim_due(now_ms=now_ms(), limit=10) as again:
            assert len(again.rows) == 3, "rolled back: every row is due again"
    finally:
        a.close()
        b.close()


def test_retry_later_and_dead_letters_are_recorded_with_the_claim(database_url: str) -> None:
    url = fresh_database(database_url)
    store = _store(url)
    try:
        store.insert_batch(_pending(3, now_ms() - 1_000), (), now_ms=now_ms())
        later = now_ms() + 60_000
        with store.claim_due(now_ms=now_ms(), limit=10) as claim:
            one, two, three = (r.id for r in claim.rows)
            claim.settle(
                Settlement(
                    delivered=[one],
                    dead=[(two, DeadLetterReason.DELIVERY_FAILED, "too large")],
                    retry=[three],
                    retry_at_ms=later,
                )
            )
        assert _pending_ids(url) == {three}
        assert store.next_wake_ms() == later
        letters = store.dead_letters()
        assert [(d["reason_code"], d["reason"], d["source"]) for d in letters] == [
            ("delivery_failed", "too large", "scheduler")
        ]
    finally:
        store.close()


def test_a_hung_claim_is_ended_by_the_database_and_its_rows_freed(database_url: str) -> None:
    url = fresh_database(database_url)
    hung, other = _store(url, claim_timeout_s=1.0), _store(url)
    try:
        hung.insert_batch(_pending(2, now_ms() - 1_000), (), now_ms=now_ms())
        holding = threading.Event()
        released = threading.Event()

        def hold() -> None:
            try:
                with hung.claim_due(now_ms=now_ms(), limit=10) as claim:
                    assert len(claim.rows) == 2
                    holding.set()
                    released.wait(10)  # a scheduler stuck between claim and settle
                    claim.settle(Settlement(delivered=[r.id for r in claim.rows]))
            except Exception:  # the session was terminated under it: that is the point
                pass

        thread = threading.Thread(target=hold)
        thread.start()
        assert holding.wait(10)
        with other.claim_due(now_ms=now_ms(), limit=10) as meanwhile:
            assert meanwhile.rows == []
        time.sleep(2.0)  # longer than claim_timeout_s
        with other.claim_due(now_ms=now_ms(), limit=10) as after:
            assert len(after.rows) == 2, "the hung instance's rows went back to the others"
        released.set()
        thread.join(10)
        assert _pending_ids(url) != set(), "the hung claim's late settle did not commit"
    finally:
        hung.close()
        other.close()
