"""Intake's inserts into the store, on a real PostgreSQL: a request stored once, whatever
is read again.

A batch is copied straight into place unless one of its rows is already stored; then
it goes through a staging table that skips those. Both paths must store every new row
once, with its headers and payload byte for byte.
"""

from __future__ import annotations

import dataclasses
import random

import psycopg
import pytest

from redrive.reasons import DeadLetterReason
from redrive.records import DeadLetterRecord, PendingRetry, RequestCoordinates
from redrive.requests import failure_identity
from redrive.service.store import Settlement, Store, Stored
from redrive.service.store.packed_headers import unpack_headers
from tests.integration.service_harness import fresh_database, now_ms

pytestmark = pytest.mark.integration

HEADERS = [("trace", b"\x00\xff"), ("empty", None), ("redrive-retry-at", b"1")]


def _request(offset: int, *, original_offset: int | None = None) -> PendingRetry:
    return _identified(
        PendingRetry(
            due_ms=now_ms() + 60_000,
            destination="orders",
            partition=None,
            key=f"k{offset}".encode(),
            value=bytes(range(256)) * 4,
            headers=HEADERS,
            attempt=2,
            group="billing" if original_offset is not None else None,
            deadline_ms=None,
            original_topic="orders" if original_offset is not None else None,
            original_partition=0 if original_offset is not None else None,
            original_offset=original_offset,
            request=RequestCoordinates("redrive.requests", 1, offset),
            identity=b"",
        )
    )


def _insert(
    store: Store, pending: list[PendingRetry], dead: list[DeadLetterRecord] | None = None
) -> Stored:
    return store.insert_batch(pending, dead or [], now_ms=now_ms())


def _identified(row: PendingRetry, **changes: object) -> PendingRetry:
    """``row`` with ``changes``, and the identity intake would give it then."""
    row = dataclasses.replace(row, **changes)  # type: ignore[arg-type]
    fields = (row.group, row.original_topic, row.original_partition, row.original_offset)
    return dataclasses.replace(row, identity=failure_identity(*fields, row.attempt, row.request))


def _stored(url: str) -> list[tuple[int, bytes, bytes, list[tuple[str, bytes | None]]]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT request_offset, msg_key, msg_value, headers FROM redrive_pending"
            " ORDER BY request_offset"
        ).fetchall()
    return [(o, k, v, unpack_headers(h)) for o, k, v, h in rows]


@pytest.fixture
def store_url(database_url: str) -> str:
    return fresh_database(database_url)


def test_a_new_batch_is_stored_whole_and_byte_for_byte(store_url: str) -> None:
    store = Store(store_url)
    store.open()
    try:
        assert _insert(store, [_request(i) for i in range(5)]).inserted == 5
    finally:
        store.close()
    stored = _stored(store_url)
    assert [row[0] for row in stored] == [0, 1, 2, 3, 4]
    assert all(row[2] == bytes(range(256)) * 4 for row in stored)
    assert all(row[3] == HEADERS for row in stored)


@pytest.mark.parametrize("names_its_failure", [False, True])
def test_a_batch_read_again_stores_only_its_new_requests(
    store_url: str, names_its_failure: bool
) -> None:
    # A request that names its failure is unique on it; one that does not, on where it
    # was read (migration 008): either way a request read again is not stored twice.
    def request(i: int) -> PendingRetry:
        return _request(i, original_offset=100 + i if names_its_failure else None)

    store = Store(store_url)
    store.open()
    try:
        assert _insert(store, [request(i) for i in range(3)]).inserted == 3
        # Intake crashed before committing offsets: the batch comes back, with more.
        assert _insert(store, [request(i) for i in range(6)]).inserted == 3
        assert _insert(store, [request(i) for i in range(6)]).inserted == 0
        # And the next batch, with nothing stored before, is whole again.
        assert _insert(store, [request(i) for i in range(6, 8)]).inserted == 2
    finally:
        store.close()
    assert [row[0] for row in _stored(store_url)] == list(range(8))


def test_a_failure_written_twice_by_its_consumer_is_stored_once(store_url: str) -> None:
    store = Store(store_url)
    store.open()
    try:
        # Same group, original coordinates and attempt: the same failure, two requests.
        first, again = _request(10, original_offset=7), _request(11, original_offset=7)
        other = _request(12, original_offset=8)
        assert _insert(store, [first, again, other]).inserted == 2
        later = _identified(_request(13, original_offset=7), attempt=3)
        assert _insert(store, [later]).inserted == 1, "the next attempt is a new request"
    finally:
        store.close()
    assert [row[0] for row in _stored(store_url)] == [10, 12, 13]


def test_a_key_longer_than_an_index_page_is_stored_and_found_in_every_table(
    store_url: str,
) -> None:
    # A b-tree entry must fit in a third of a page (about 2.7 kB): the key indexes of
    # the history and the dead letters must take a key of any length, and find it.
    # Random bytes: a repetitive key would be compressed in its index entry and fit.
    long_key = random.Random(9).randbytes(10_000)
    delivered = dataclasses.replace(_request(0), key=long_key, due_ms=0)
    dead = dataclasses.replace(_request(1), key=long_key, due_ms=0, deadline_ms=1)
    store = Store(store_url, keep_history=True)
    store.open()
    try:
        assert _insert(store, [delivered, dead]).inserted == 2
        with store.claim_due(now_ms=now_ms(), limit=10) as claim:
            ids = {row.deadline_ms: row.id for row in claim.rows}
            claim.settle(
                Settlement(
                    delivered=[ids[None]],
                    dead=[(ids[1], DeadLetterReason.DEADLINE_PASSED, "deadline passed")],
                )
            )
        steps = store.record_steps(key=long_key)
        assert store.record_steps(key=long_key[:-1]) == []
    finally:
        store.close()
    assert sorted(step.kind for step in steps) == ["dead", "delivered"]
    assert all(bytes(step.msg_key) == long_key for step in steps)


def test_a_delivered_retry_already_in_the_history_is_settled_keeping_the_first_copy(
    store_url: str,
) -> None:
    # No path copies a row to the history twice, so the copy does not guard against it
    # statement by statement; if one ever were there, the settlement must still go
    # through (a failed one would deliver its batch again, forever).
    store = Store(store_url, keep_history=True)
    store.open()
    try:
        assert _insert(store, [dataclasses.replace(_request(0), due_ms=0)]).inserted == 1
        with store.claim_due(now_ms=now_ms(), limit=10) as claim:
            [row] = claim.rows
        with psycopg.connect(store_url, autocommit=True) as conn:  # the earlier copy
            conn.execute(
                "INSERT INTO redrive_history (id, destination, headers, attempt, due_ms,"
                " received_at) VALUES (%s, 'first copy', '\\x90', 1, 0, now())",
                (row.id,),
            )
        with store.claim_due(now_ms=now_ms(), limit=10) as claim:
            assert [r.id for r in claim.rows] == [row.id]
            claim.settle(Settlement(delivered=[row.id]))
        with store.claim_due(now_ms=now_ms(), limit=10) as claim:
            assert claim.rows == []  # settled: not delivered again
    finally:
        store.close()
    with psycopg.connect(store_url) as conn:
        kept = conn.execute("SELECT id, destination FROM redrive_history").fetchall()
    assert kept == [(row.id, "first copy")]
