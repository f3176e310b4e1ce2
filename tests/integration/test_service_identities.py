"""The store as an idempotent receiver, on a real PostgreSQL: a request whose identity
was accepted before is dropped, whatever became of its first copy, for as long as the
identity is kept; a store upgraded from before identities were kept has them for what
it already held. Another request under an accepted identity (other content) is not a
repeat but a forgery: a dead letter under an identity of its own.
"""

from __future__ import annotations

import dataclasses

import psycopg
import pytest

from redrive.reasons import DeadLetterReason
from redrive.records import DeadLetterRecord, PendingRetry, Release, RequestCoordinates
from redrive.requests import Incoming, content_of, failure_identity, read_at_identity
from redrive.service.migrations import migrate
from redrive.service.store import Settlement, Store, Stored
from redrive.service.store.identity_backfill import AFTER
from tests.integration.service_harness import fresh_database, now_ms

pytestmark = pytest.mark.integration

GROUP = "billing"


def _retry(original_offset: int, attempt: int = 1, *, read_at: int = 0) -> PendingRetry:
    """A retry of the record at ``original_offset`` after failed attempt ``attempt``,
    read from the requests topic at offset ``read_at``."""
    where = RequestCoordinates("redrive.requests", 0, read_at)
    return PendingRetry(
        due_ms=now_ms() - 1_000,
        destination="orders",
        partition=None,
        key=b"k",
        value=str(original_offset).encode(),
        headers=[],
        attempt=attempt,
        group=GROUP,
        deadline_ms=None,
        original_topic="orders",
        original_partition=0,
        original_offset=original_offset,
        request=where,
        identity=failure_identity(GROUP, "orders", 0, original_offset, attempt, where),
    )


def _letter(retry: PendingRetry, read_at: int) -> DeadLetterRecord:
    """The same failure sent to the dead letters by its consumer."""
    return DeadLetterRecord(
        topic="orders",
        key=retry.key,
        value=retry.value,
        headers=[],
        reason_code=DeadLetterReason.SENT_TO_DLQ,
        reason="sent to the dead letters by its consumer",
        source="intake",
        attempt=retry.attempt,
        group=GROUP,
        original_topic="orders",
        original_partition=0,
        original_offset=retry.original_offset,
        request=RequestCoordinates("redrive.requests", 0, read_at),
        identity=retry.identity,
    )


def _insert(
    store: Store,
    pending: list[PendingRetry],
    dead: list[DeadLetterRecord] | None = None,
    releases: list[Release] | None = None,
) -> Stored:
    return store.insert_batch(pending, dead or [], releases or [], now_ms=now_ms())


def _count(url: str, table: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def store(database_url: str) -> Store:
    opened = Store(fresh_database(database_url), keep_history=True)
    opened.open()
    yield opened  # type: ignore[misc]
    opened.close()


def _deliver_everything_due(store: Store) -> None:
    with store.claim_due(now_ms=now_ms(), limit=100) as claim:
        claim.settle(Settlement(delivered=[row.id for row in claim.rows]))


def test_a_retry_sent_again_after_its_delivery_is_dropped(store: Store) -> None:
    first = _retry(7, read_at=0)
    assert _insert(store, [first]).inserted == 1
    _deliver_everything_due(store)
    # The sender repeats itself (a Spark batch run again): same failure, read elsewhere.
    again = dataclasses.replace(first, request=first.request._replace(offset=9))
    stored = _insert(store, [again, _retry(8, read_at=10)])
    assert stored.inserted == 1 and stored.repeats == [again]
    with store.claim_due(now_ms=now_ms(), limit=100) as claim:
        assert [row.value for row in claim.rows] == [b"8"]


def test_a_failure_that_became_a_dead_letter_is_dropped_as_a_retry_or_a_letter(
    store: Store,
) -> None:
    url = store.pool.conninfo
    retry = _retry(7, attempt=3)
    letter = _letter(retry, read_at=1)
    assert _insert(store, [], [letter]).repeats == []
    # Sent again as the dead letter, or (its policy deciding otherwise the second time)
    # as a retry of the same failure: one failure, handed off once.
    stored = _insert(
        store,
        [dataclasses.replace(retry, request=retry.request._replace(offset=2))],
        [_letter(retry, read_at=3)],
    )
    assert stored.inserted == 0 and len(stored.repeats) == 2
    assert _count(url, "redrive_dead_letters") == 1
    assert _count(url, "redrive_pending") == 0


def test_a_repeat_inside_one_batch_is_stored_once_and_the_next_attempt_is_new(
    store: Store,
) -> None:
    url = store.pool.conninfo
    first = _retry(7, read_at=0)
    again = dataclasses.replace(first, request=first.request._replace(offset=1))
    stored = _insert(store, [first, again, _retry(7, attempt=2, read_at=2)])
    assert stored.inserted == 2 and stored.repeats == [again]
    assert _count(url, "redrive_pending") == 2


def test_a_release_sent_again_releases_nothing_more(store: Store) -> None:
    url = store.pool.conninfo
    head = _retry(7, attempt=1, read_at=0)
    head = dataclasses.replace(head, order="key")
    queue = head.order_queue
    assert queue is not None
    behind = dataclasses.replace(
        _retry(8, read_at=1),
        attempt=0,
        order="behind",
        identity=failure_identity(GROUP, "orders", 0, 8, 0, RequestCoordinates("r", 0, 1)),
    )
    assert _insert(store, [head, behind]).inserted == 2

    def release_of(offset: int, attempt: int, read_at: int) -> Release:
        where = RequestCoordinates("redrive.requests", 0, read_at)
        same = failure_identity(GROUP, "orders", 0, offset, attempt, where, release=True)
        return Release(queue, offset, attempt, where, same)

    with store.claim_due(now_ms=now_ms(), limit=100) as claim:
        assert [row.value for row in claim.rows] == [b"7", b"8"]  # one run
        claim.settle(Settlement(kept=[row.id for row in claim.rows]))
    later = dataclasses.replace(
        _retry(9, read_at=2),
        attempt=0,
        order="behind",
        identity=failure_identity(GROUP, "orders", 0, 9, 0, RequestCoordinates("r", 0, 2)),
    )
    assert _insert(store, [later]).inserted == 1
    assert _insert(store, [], releases=[release_of(7, 1, read_at=3)]).repeats == []
    repeat = release_of(7, 1, read_at=4)
    assert _insert(store, [], releases=[repeat]).repeats == [repeat]
    # The record behind is still out with its consumer: nothing else became due.
    with store.claim_due(now_ms=now_ms(), limit=100) as claim:
        assert claim.rows == []
    assert _count(url, "redrive_pending") == 2


def test_an_identity_is_forgotten_only_after_its_window(store: Store) -> None:
    late = dataclasses.replace(_retry(7), due_ms=now_ms() + 3_600_000)
    _insert(store, [_retry(6), late])
    assert store.prune_accepted(before_ms=now_ms() - 60_000, limit=100) == 0
    # A window of a minute, an hour and a half on: the delivered one's window is over,
    # the one due in an hour is a repeat for a minute after it is due.
    assert store.prune_accepted(before_ms=now_ms() + 5_400_000 - 60_000, limit=100) == 2
    assert _insert(store, [_retry(6, read_at=5)]).inserted == 1


def test_an_upgraded_store_knows_the_identities_of_what_it_held(database_url: str) -> None:
    url = fresh_database(database_url)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn, up_to=9)
        conn.execute(
            "INSERT INTO redrive_pending (due_ms, destination, headers, attempt, group_id,"
            " original_topic, original_partition, original_offset, request_topic,"
            " request_partition, request_offset) VALUES"
            " (0, 'orders', '\\x90', 1, %s, 'orders', 0, 7, 'redrive.requests', 0, 0),"
            " (0, 'orders', '\\x90', 1, NULL, NULL, NULL, NULL, 'redrive.requests', 0, 1)",
            (GROUP,),
        )
        conn.execute(
            "INSERT INTO redrive_dead_letters (topic, headers, attempt, group_id,"
            " original_topic, original_partition, original_offset, reason_code, reason,"
            " source, request_topic, request_partition, request_offset) VALUES"
            " ('orders', '\\x90', 2, %s, 'orders', 0, 8, 'sent_to_dlq', 'x', 'intake',"
            " 'redrive.requests', 0, 2)",
            (GROUP,),
        )
        assert migrate(conn, up_to=10, after=AFTER) == ["010_accepted_identities"]
    store = Store(url)
    store.open()
    try:
        anonymous = dataclasses.replace(
            _retry(0, read_at=1),
            group=None,
            original_topic=None,
            original_partition=None,
            original_offset=None,
        )
        anonymous = dataclasses.replace(
            anonymous, identity=failure_identity(None, None, None, None, 1, anonymous.request)
        )
        repeats = [_retry(7, read_at=5), _retry(8, attempt=2, read_at=6), anonymous]
        stored = _insert(store, repeats)
        assert stored.inserted == 0 and stored.repeats == repeats
    finally:
        store.close()


def _content(value: bytes, *, vouched: bool = True) -> bytes:
    return content_of(b"k", value, vouched=vouched)


def test_another_request_under_an_accepted_identity_is_a_forgery_of_its_own(
    store: Store,
) -> None:
    """Same identity, other content: refused as a letter under where it was read, in
    the batch's transaction; the accepted request stays; read again, it is a repeat."""
    url = store.pool.conninfo
    genuine = dataclasses.replace(_retry(7, read_at=0), content=_content(b"7"))
    assert _insert(store, [genuine]).inserted == 1
    forged = dataclasses.replace(
        genuine, value=b"forged", request=genuine.request._replace(offset=1), content=_content(b"f")
    )
    copy = dataclasses.replace(genuine, request=genuine.request._replace(offset=2))
    stored = _insert(store, [forged, copy])
    assert stored.inserted == 0 and stored.repeats == [copy] and stored.forged == [forged]
    [letter] = stored.forgeries
    assert letter.reason_code is DeadLetterReason.INVALID_SIGNATURE
    assert letter.reason.startswith("invalid signature: a different request under the redrive-id")
    assert letter.identity == read_at_identity(forged.request) != genuine.identity
    assert (letter.value, letter.topic, letter.original_offset) == (b"forged", "orders", 7)
    assert stored.letters([]) == [letter]
    # Read again (intake stopped before its commit): a repeat of the forgery's letter.
    again = _insert(store, [forged])
    assert again.forgeries == [] and [r.identity for r in again.repeats] == [letter.identity]
    assert _count(url, "redrive_dead_letters") == 1
    with store.claim_due(now_ms=now_ms(), limit=100) as claim:
        assert [row.value for row in claim.rows] == [b"7"]


def test_in_one_batch_the_first_read_is_accepted_and_another_after_it_is_forged(
    store: Store,
) -> None:
    first = dataclasses.replace(_retry(7, read_at=3), content=_content(b"7"))
    # Listed first, read after: the order read decides, not the order given.
    later = dataclasses.replace(
        first, value=b"f", request=first.request._replace(offset=4), content=_content(b"f")
    )
    letter = dataclasses.replace(_letter(first, read_at=5), content=_content(b"7"))
    stored = _insert(store, [later, first], [letter])
    assert stored.inserted == 1 and stored.forged == [later] and stored.repeats == [letter]
    with store.claim_due(now_ms=now_ms(), limit=100) as claim:
        assert [row.value for row in claim.rows] == [b"7"]


def test_an_identity_accepted_before_contents_were_kept_takes_any_copy_as_a_repeat(
    store: Store,
) -> None:
    old = _retry(7, read_at=0)  # content None: stored by an older intake
    assert old.content is None and _insert(store, [old]).inserted == 1
    other = dataclasses.replace(
        old, value=b"other", request=old.request._replace(offset=1), content=_content(b"o")
    )
    stored = _insert(store, [other])
    assert stored.repeats == [other] and stored.forged == []


def test_a_forged_release_is_a_letter_keeping_its_message(store: Store) -> None:
    url = store.pool.conninfo
    head = dataclasses.replace(_retry(7), order="key", content=_content(b"7"))
    queue = head.order_queue
    assert queue is not None and _insert(store, [head]).inserted == 1
    where = RequestCoordinates("redrive.requests", 0, 1)
    same = failure_identity(GROUP, "orders", 0, 7, 1, where, release=True)
    genuine = Release(queue, 7, 1, where, same, content_of(b"k", None, vouched=True))
    assert _insert(store, [], releases=[genuine]).repeats == []
    forged_at = RequestCoordinates("redrive.requests", 0, 2)
    forged = Release(queue, 7, 1, forged_at, same, content_of(b"k", None, vouched=False))
    message = Incoming(forged_at.topic, 0, 2, b"k", None, [("redrive-order", b"release")])
    stored = store.insert_batch([], [], [forged], now_ms=now_ms(), read=[message])
    [letter] = stored.forgeries
    assert (letter.key, letter.headers, letter.request) == (b"k", message.headers, forged_at)
    assert _count(url, "redrive_dead_letters") == 1
