"""Key queues delivered in runs, on a real PostgreSQL: a head goes with the records
waiting behind it, claimed together and marked with their run; a record of a run that
fails again holds the rest of the run again behind its new attempt; a run stops before
a record not due, and at its cap; a record acknowledged out of its run's order is not
counted delivered, and goes again in the next run; a run's records say where they go,
and are signed again when their requests were signed with the service's keys.
"""

from __future__ import annotations

import base64
import dataclasses
import time
from collections.abc import Iterator

import pytest

from redrive.headers import DESTINATION, PARTITION, RUN, SIGNATURE, RetryHeaders, encode
from redrive.records import PendingRetry, Release, RequestCoordinates
from redrive.requests import failure_identity
from redrive.returns import signature_of
from redrive.service.scheduler import sign_again
from redrive.service.store import Settlement, Store
from redrive.service.store.claims import ClaimedRetry
from redrive.service.store.key_queues import RUN_MOST
from redrive.signing import KeyRing, Verdict
from tests.integration.service_harness import fresh_database, now_ms

pytestmark = pytest.mark.integration

GROUP = "billing"


@pytest.fixture
def store(database_url: str) -> Iterator[Store]:
    opened = Store(fresh_database(database_url), keep_history=False)
    opened.open()
    try:
        yield opened
    finally:
        opened.close()


class Requests:
    """Requests of one key's queue, each read at the next offset of the requests topic."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.read_at = 0

    def _where(self) -> RequestCoordinates:
        self.read_at += 1
        return RequestCoordinates("redrive.requests", 0, self.read_at)

    def retry(self, offset: int, attempt: int = 1, due_in_ms: int = -1_000) -> PendingRetry:
        """A retry of the record at ``offset`` after its attempt ``attempt`` failed."""
        where = self._where()
        return PendingRetry(
            due_ms=now_ms() + due_in_ms,
            destination="orders",
            partition=0,
            key=self.key,
            value=str(offset).encode(),
            headers=[("trace", b"t")],
            attempt=attempt,
            group=GROUP,
            deadline_ms=None,
            original_topic="orders",
            original_partition=0,
            original_offset=offset,
            request=where,
            identity=failure_identity(GROUP, "orders", 0, offset, attempt, where),
            order="key",
        )

    def behind(self, offset: int, due_in_ms: int = -1_000) -> PendingRetry:
        """A record read behind the key's head, not handled yet."""
        return dataclasses.replace(self.retry(offset, 0, due_in_ms), attempt=0, order="behind")

    def release(self, offset: int, attempt: int) -> Release:
        where = self._where()
        queue = self.retry(offset).order_queue
        assert queue is not None
        same = failure_identity(GROUP, "orders", 0, offset, attempt, where, release=True)
        return Release(queue, offset, attempt, where, same)


def store_all(
    store: Store, pending: list[PendingRetry], releases: list[Release] | None = None
) -> None:
    stored = store.insert_batch(pending, [], releases or [], now_ms=now_ms())
    assert stored.repeats == []


def deliver(store: Store, *, acked: int | None = None, limit: int = 200) -> list[ClaimedRetry]:
    """Claim what is due and settle it as delivered (all of it, or all but the row at
    index ``acked``, which failed for a passing reason)."""
    with store.claim_due(now_ms=now_ms(), limit=limit) as claim:
        rows = claim.rows
        kept = [r.id for i, r in enumerate(rows) if i != acked]
        retry = [r.id for i, r in enumerate(rows) if i == acked]
        claim.settle(Settlement(kept=kept, retry=retry, retry_at_ms=now_ms() - 1))
    return rows


def values(rows: list[ClaimedRetry]) -> list[bytes | None]:
    return [r.value for r in rows]


def run_of(row: ClaimedRetry) -> bytes | None:
    runs = [value for name, value in row.headers if name == RUN]
    assert len(runs) <= 1
    return runs[0] if runs else None


def test_a_head_goes_with_the_records_behind_it_in_one_run(store: Store) -> None:
    a, b = Requests(b"a"), Requests(b"b")
    store_all(store, [a.retry(10), a.behind(11), a.behind(12), b.retry(20), b.behind(21)])
    store_all(store, [a.behind(13)])

    rows = deliver(store)
    by_key = {k: [r for r in rows if r.key == k] for k in (b"a", b"b")}
    assert values(by_key[b"a"]) == [b"10", b"11", b"12", b"13"]
    assert values(by_key[b"b"]) == [b"20", b"21"]
    # Each key's run is contiguous in the claim (produced in its order) and named by
    # its head's row; the stored headers are kept, the run's added after them.
    for run in by_key.values():
        start = rows.index(run[0])
        assert rows[start : start + len(run)] == run
        assert {run_of(r) for r in run} == {str(run[0].id).encode()}
        assert all(r.headers[0] == ("trace", b"t") for r in run)

    # The whole run is out: nothing of either key goes until its consumer is done.
    assert deliver(store) == []
    store_all(store, [a.behind(14)], [a.release(10, 1), a.release(11, 0), b.release(20, 1)])
    assert deliver(store) == []
    store_all(store, [], [a.release(12, 0), a.release(13, 0), b.release(21, 0)])
    # Then the record that arrived behind the run goes, as a run of its own.
    (last,) = deliver(store)
    assert last.value == b"14" and run_of(last) == str(last.id).encode()


def test_a_record_of_a_run_failing_again_holds_the_rest_again_behind_it(store: Store) -> None:
    a = Requests(b"a")
    store_all(store, [a.retry(10), a.behind(11), a.behind(12), a.behind(13)])
    first = deliver(store)
    assert values(first) == [b"10", b"11", b"12", b"13"]

    # Its consumer handled 10 and failed on 11: it released 10, retried 11 (due later)
    # and dropped 12 and 13, which wait again behind 11's new attempt.
    store_all(store, [a.retry(11, attempt=1, due_in_ms=200)], [a.release(10, 1)])
    assert deliver(store) == []
    again = _eventually_due(store)
    assert values(again) == [b"11", b"12", b"13"]
    assert [r.id for r in again[1:]] == [r.id for r in first[2:]]
    assert {run_of(r) for r in again} == {str(again[0].id).encode()}
    assert again[0].id not in {r.id for r in first}  # 11's new attempt: a new run


def test_a_run_stops_before_a_record_not_due_and_at_its_cap(store: Store) -> None:
    a = Requests(b"a")
    store_all(store, [a.retry(1), a.behind(2), a.behind(3, due_in_ms=60_000), a.behind(4)])
    assert values(deliver(store)) == [b"1", b"2"]  # 4 may not overtake 3

    b = Requests(b"b")  # (its offsets after a's: one partition's)
    head, end = 100, 100 + RUN_MOST + RUN_MOST // 2
    store_all(store, [b.retry(head), *(b.behind(offset) for offset in range(head + 1, end))])
    run = deliver(store)  # (a's 3 is not due: b's head is the one due)
    assert values(run) == [str(offset).encode() for offset in range(head, head + RUN_MOST)]
    store_all(
        store,
        [],
        [b.release(head, 1), *(b.release(o, 0) for o in range(head + 1, head + RUN_MOST))],
    )
    rest = deliver(store)
    assert values(rest) == [str(offset).encode() for offset in range(head + RUN_MOST, end)]
    assert {run_of(r) for r in rest} == {str(rest[0].id).encode()}


def test_a_record_acknowledged_out_of_its_runs_order_is_not_counted_delivered(
    store: Store,
) -> None:
    # 11 failed to reach the broker for a passing reason while 12 did: 12 is not
    # counted delivered (it waits behind 11), and goes again in 11's next run.
    a = Requests(b"a")
    store_all(store, [a.retry(10), a.behind(11), a.behind(12)])
    assert values(deliver(store, acked=1)) == [b"10", b"11", b"12"]
    assert deliver(store) == []  # 10 is out
    store_all(store, [], [a.release(10, 1)])
    assert values(deliver(store)) == [b"11", b"12"]


def _eventually_due(store: Store) -> list[ClaimedRetry]:
    """What a claim finds once a retry due shortly is due (a deadline, not a sleep)."""
    deadline = now_ms() + 30_000
    while now_ms() < deadline:
        rows = deliver(store)
        if rows:
            return rows
        time.sleep(0.05)
    raise AssertionError("nothing became due within 30 s")


def test_heads_past_a_claims_room_wait_for_the_next_claim_rather_than_go_alone(
    store: Store,
) -> None:
    # A claim of 3 has room for 12 rows behind its heads: a's and b's runs fill it, so
    # c's head waits for the next claim (delivered alone, it would leave its run behind).
    a, b, c = Requests(b"a"), Requests(b"b"), Requests(b"c")
    store_all(store, [a.retry(0, due_in_ms=-3_000), *(a.behind(o) for o in range(1, 7))])
    store_all(store, [b.retry(10, due_in_ms=-2_000), *(b.behind(o) for o in range(11, 17))])
    store_all(store, [c.retry(20), c.behind(21)])
    first = deliver(store, limit=3)
    assert values(first) == [str(o).encode() for o in [*range(7), *range(10, 17)]]
    assert values(deliver(store, limit=3)) == [b"20", b"21"]


def test_a_run_names_where_it_goes_and_is_signed_again_when_its_request_was(
    store: Store,
) -> None:
    """A record behind a head that now goes elsewhere (its route moved its retries)
    says where it is delivered, as its reader checks; and each record of a run, whose
    mark changed what its request's signature was made over, is signed again with the
    key of the service's its request was signed with (its sender holds that one, in a
    rotation too): but only one whose request our keys signed."""
    new, old = (f"{i}={base64.b64encode(i.encode() * 16).decode()}" for i in ("k2", "k1"))
    keys, previous = KeyRing.from_settings([new, old]), KeyRing.from_settings([old])
    stranger = KeyRing.from_settings([f"k9={base64.b64encode(b'x' * 32).decode()}"])

    def signed(row: PendingRetry, ring: KeyRing | None) -> PendingRetry:
        request = RetryHeaders(destination=row.destination, retry_at=0, partition=row.partition)
        headers = encode(request, [("trace", b"t")])
        if ring is not None:
            headers = ring.signed(headers, row.key, row.value)
        return dataclasses.replace(row, headers=headers)

    a, b, c, d = (Requests(key) for key in (b"a", b"b", b"c", b"d"))
    moved = dataclasses.replace(a.behind(11), destination="orders.old", partition=None)
    store_all(
        store,
        [
            signed(a.retry(10), keys),
            signed(moved, keys),
            signed(b.retry(20), None),
            signed(c.retry(30), stranger),
            signed(d.retry(40), previous),
        ],
    )
    rows = {r.value: r for r in deliver(store)}
    behind = rows[b"11"]
    assert (behind.destination, behind.partition) == ("orders", 0)
    told = dict(behind.headers)
    assert (told[DESTINATION], told[PARTITION]) == (b"orders", b"0")
    assert behind.as_stored is not None and dict(behind.as_stored)[DESTINATION] == b"orders.old"
    before = {value: list(row.headers) for value, row in rows.items()}
    sign_again(list(rows.values()), keys)
    for value, key_id in ((b"10", "k2"), (b"11", "k2"), (b"40", "k1")):
        row = rows[value]
        assert row.headers[-1][0] == SIGNATURE and dict(row.headers)[RUN] is not None
        signature = signature_of(row.headers)
        assert signature is not None and signature.split(":")[1] == key_id
        assert keys.verify(row.headers, row.key, row.value, signature).verdict is Verdict.VALID
    # Unsigned, or signed with a key not ours: the service vouches for neither.
    assert rows[b"20"].headers == before[b"20"] and rows[b"30"].headers == before[b"30"]
