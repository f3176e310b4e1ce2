"""The Spark scheduler on real Spark (local mode) and the real broker.

Requests go into a requests topic; the scheduler query must deliver each to its
destination not before its redrive-retry-at, unchanged; refuse invalid ones to the
DLQ topic with the retry service's reason; and keep what is pending across a restart
from the same checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from redrive.deadlines import Deadline
from redrive.headers import DEAD_LETTER_REASON, Header, RetryHeaders, encode, request_id
from redrive.spark.repeats import repeats_dropped
from redrive.spark.scheduler import build_scheduler_query
from redrive.spark.session import spark_session, stop_with_jvm
from tests.integration.placement import keys_apart
from tests.integration.service_harness import now_ms, produce, request_headers
from tests.spark import Received, TopicReader, create_topics, unique

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("redrive-test-scheduler")
    # requests_read sums the progress Spark keeps: keep all of it, not the last 100.
    session.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
    yield session
    stop_with_jvm(session)


def requests_read(query: Any) -> int:
    """Requests the query has read from Kafka (its other source is one tick per batch)."""
    return sum(
        source["numInputRows"]
        for progress in query.recentProgress
        for source in progress["sources"]
        if "Kafka" in source["description"]
    )


def wait_for_requests(query: Any, count: int, timeout_s: float = 120) -> None:
    """Until the query has read (and, its batch committed, stored) ``count`` requests."""
    deadline = Deadline(timeout_s)
    while not deadline.passed():
        assert query.exception() is None, query.exception()
        if requests_read(query) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"the query did not read {count} requests in {deadline.describe()}")


def wait_until_running(query: Any, timeout_s: float = 120) -> None:
    """Until the query's first micro-batch completed (JVM and Python workers are warm)."""
    deadline = Deadline(timeout_s)
    while not query.recentProgress and not deadline.passed():
        assert query.exception() is None, query.exception()
        time.sleep(0.2)
    assert query.recentProgress, "the scheduler query did not complete a batch"


@dataclass
class Scheduler:
    query: Any
    bootstrap: str
    requests_topic: str
    dlq_topic: str
    destinations: list[str]
    """Allowed destination topics, one per test, created before the query started
    (the scheduler, like the service, caches which topics exist)."""
    small: str
    """An allowed destination that accepts record batches of SMALL_TOPIC_BYTES at most."""
    compacted: str
    """An allowed destination with cleanup.policy=compact (no record without a key)."""
    placed: str
    """An allowed destination of PLACED_PARTITIONS, for where keys land."""


SMALL_TOPIC_BYTES = 1024
PLACED_PARTITIONS = 6
MODULE_TRIGGER = "2 seconds"
"""The scheduler queries' trigger in this module. A query runs a batch every trigger
for as long as it lives, idle or not (two Spark jobs, their Python workers and
Kafka): what the tests prove (never before due, due order, dead letters, repeats,
pending requests kept across a restart) holds at any interval, and a shorter one
would only spend CPU on batches with nothing in them. Leads below are several
triggers long, so that what is meant to wait in state does."""


@pytest.fixture(scope="module")
def scheduler(
    spark: Any, bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scheduler]:
    requests, dlq = unique("requests"), unique("dlq")
    destinations = [unique("ok-dest") for _ in range(4)]
    create_topics(bootstrap, requests, *destinations, partitions=2)
    create_topics(bootstrap, dlq)
    small, compacted = unique("ok-small"), unique("ok-compacted")
    create_topics(bootstrap, small, config={"max.message.bytes": str(SMALL_TOPIC_BYTES)})
    create_topics(bootstrap, compacted, config={"cleanup.policy": "compact"})
    placed = unique("ok-placed")
    create_topics(bootstrap, placed, partitions=PLACED_PARTITIONS)
    query = build_scheduler_query(
        spark,
        bootstrap=bootstrap,
        requests_topic=requests,
        dlq_topic=dlq,
        allowed_destinations=["ok-*"],
        checkpoint=str(tmp_path_factory.mktemp("scheduler") / "checkpoint"),
        trigger_interval=MODULE_TRIGGER,
    )
    wait_until_running(query)
    yield Scheduler(query, bootstrap, requests, dlq, destinations, small, compacted, placed)
    query.stop()


# First in the module, as it runs a query of its own: the module's scheduler query
# (the fixture, started by the next test) runs a batch every trigger while it lives,
# idle or not (see MODULE_TRIGGER), which this test's query and its
# wait need not share the session and the machine with.
def test_pending_requests_survive_a_restart(spark: Any, bootstrap: str, tmp_path: Path) -> None:
    requests, dlq, destination = unique("requests"), unique("dlq"), unique("dest")
    create_topics(bootstrap, requests, partitions=2)
    create_topics(bootstrap, dlq, destination)
    checkpoint = str(tmp_path / "checkpoint")

    def start() -> Any:
        return build_scheduler_query(
            spark,
            bootstrap=bootstrap,
            requests_topic=requests,
            dlq_topic=dlq,
            allowed_destinations=[destination],
            checkpoint=checkpoint,
            trigger_interval=MODULE_TRIGGER,
            query_name=None,
        )

    reader = TopicReader(bootstrap, [destination, dlq])
    query = start()
    wait_until_running(query)
    # Due well after the query will have stored them and stopped, even on a slow machine
    # (a first batch with data can take 10 s or more on 2 busy cores).
    due = now_ms() + 25_000
    records = [
        {
            "key": f"k{i}".encode(),
            "value": f"v{i}".encode(),
            "headers": request_headers(destination, due + i * 100),
        }
        for i in range(20)
    ]
    produce(bootstrap, requests, records)
    wait_for_requests(query, len(records))
    print(f"requests stored {25_000 - (due - now_ms())} ms after they were written")
    query.stop()  # 20 requests pending in state, none due yet
    reader.poll(1)
    assert reader.received == []

    time.sleep(max(0.0, (due - now_ms()) / 1000))  # they come due while it is stopped
    query = start()
    try:
        got = reader.wait_for(len(records), timeout_s=120)
        reader.poll(2)
        assert query.isActive and query.exception() is None
        # It resumed after the requests (offsets in the checkpoint): what it delivered
        # came out of its restored state and timers, not from reading them again.
        assert requests_read(query) == 0
    finally:
        query.stop()
        reader.close()
    assert sorted(r.key for r in got) == sorted(r["key"] for r in records)
    assert all(r.topic == destination for r in got)
    for message in got:
        index = int(message.key[1:]) if message.key else -1
        assert message.timestamp_ms >= due + index * 100


def test_requests_are_delivered_when_due_never_before(scheduler: Scheduler) -> None:
    destination = scheduler.destinations[0]
    reader = TopicReader(scheduler.bootstrap, [destination])
    start = now_ms()
    sent: dict[bytes, tuple[int, list[Header], int | None]] = {}
    records = []
    for i in range(30):
        retry_at = start + 6_000 + (i % 6) * 700
        if i == 0:
            retry_at = start - 1_000  # already due: delivered on arrival
        partition = i % 2 if i % 3 == 0 else None
        headers = request_headers(
            destination,
            retry_at,
            [("trace", f"t{i}".encode()), ("empty", None)],
            partition=partition,
            attempt=1 + i % 3,
            group="g",
            original_topic="orders",
            original_partition=0,
            original_offset=i,
            error_type="TimeoutError",
            error_message=f"timed out {i}",
        )
        key = f"k{i}".encode()
        sent[key] = (retry_at, headers, partition)
        records.append({"key": key, "value": f"v{i}".encode(), "headers": headers})
    produce(scheduler.bootstrap, scheduler.requests_topic, records)

    got = reader.wait_for(30, timeout_s=120)
    reader.poll(2)  # anything extra would show up here
    reader.close()

    assert sorted(r.key for r in reader.received) == sorted(sent)
    lateness = []
    for message in got:
        assert message.key is not None
        retry_at, headers, partition = sent[message.key]
        assert message.timestamp_ms >= retry_at, "delivered before it was due"
        assert message.value == b"v" + message.key[1:]
        assert message.headers == headers  # user's and redrive headers, unchanged
        if partition is not None:
            assert message.partition == partition
        lateness.append(message.timestamp_ms - retry_at)
    print(f"delivery after due: min {min(lateness)} ms, max {max(lateness)} ms")
    assert scheduler.query.isActive


def test_a_delivery_without_a_partition_is_placed_by_key_the_java_way(
    scheduler: Scheduler,
) -> None:
    """Spark's Kafka sink is the Java producer, and redrive leaves its partitioner as
    it is: a key lands where librdkafka's murmur2_random puts it (which the retry
    service and the App use by default), not where librdkafka's default would."""
    apart = keys_apart(scheduler.bootstrap, PLACED_PARTITIONS, 12, "spark")
    reader = TopicReader(scheduler.bootstrap, [scheduler.placed])
    produce(
        scheduler.bootstrap,
        scheduler.requests_topic,
        [
            {"key": key, "value": b"v", "headers": request_headers(scheduler.placed, now_ms())}
            for key in apart.keys
        ],
    )
    got = reader.wait_for(len(apart.keys), timeout_s=120)
    reader.close()
    assert {r.key: r.partition for r in got} == apart.java


def test_invalid_requests_become_dead_letters_and_the_query_keeps_running(
    scheduler: Scheduler,
) -> None:
    destination = scheduler.destinations[1]
    reader = TopicReader(scheduler.bootstrap, [scheduler.dlq_topic, destination])
    due = now_ms() + 1_000
    # Pending when it arrives (even on a slow machine), expired when it fires; never
    # exactly a trigger time (those fall on multiples of the trigger).
    expiring = now_ms() + 10_000
    expiring += 137 - expiring % 500
    missing = unique("ok-missing")
    spent = RetryHeaders(
        destination=destination,
        retry_at=due,
        attempt=3,
        send_to="dlq",
        reason="attempts exhausted (3 of 3)",
    )
    bad: list[tuple[bytes, list[Header], str]] = [
        (
            b"no-retry-at",
            [("redrive-destination", destination.encode())],
            "invalid request: redrive-retry-at: missing (required in a retry request)",
        ),
        (
            b"not-a-number",
            [("redrive-destination", destination.encode()), ("redrive-retry-at", b"soon")],
            "invalid request: redrive-retry-at: not a decimal integer: 'soon'",
        ),
        (
            b"forged",
            request_headers("elsewhere", due),
            "destination not allowed: 'elsewhere' is not in the allowlist",
        ),
        (
            b"internal",
            request_headers("__consumer_offsets", due),
            "destination not allowed: '__consumer_offsets' is not in the allowlist",
        ),
        (
            b"unknown-topic",
            request_headers(missing, due),
            f"destination topic {missing!r} does not exist",
        ),
        (
            b"spent",
            encode(spent),
            "sent to the dead letters by its consumer (redrive-send-to: dlq) "
            "after attempt 3: attempts exhausted (3 of 3)",
        ),
        (
            b"expires-while-pending",
            request_headers(destination, expiring, deadline=expiring),
            f"deadline passed while pending: redrive-deadline {expiring}, due {expiring}",
        ),
        (
            b"no-headers",
            [],
            "invalid request: redrive-destination: missing (required in a retry request)",
        ),
    ]
    records: list[dict[str, Any]] = [
        {"key": key, "value": b"payload-" + key, "headers": headers} for key, headers, _ in bad
    ]
    records.append({"key": b"good", "value": b"fine", "headers": request_headers(destination, due)})
    produce(scheduler.bootstrap, scheduler.requests_topic, records)

    reader.wait_for(len(bad), timeout_s=150, topic=scheduler.dlq_topic)
    reader.wait_for(1, timeout_s=60, topic=destination)
    reader.poll(1)
    reader.close()

    letters = {r.key: r for r in reader.of(scheduler.dlq_topic)}
    assert set(letters) == {key for key, _, _ in bad}
    for key, headers, reason in bad:
        letter = letters[key]
        assert letter.value == b"payload-" + key
        # The request's headers, then the reason, as `redrive serve` mirrors dead letters.
        assert letter.headers == [*headers, (DEAD_LETTER_REASON, reason.encode())]
    [good] = reader.of(destination)
    assert good.key == b"good" and good.timestamp_ms >= due
    assert scheduler.query.isActive and scheduler.query.exception() is None


def test_a_key_leaves_in_due_order_across_batches(scheduler: Scheduler) -> None:
    """Requests of one key arrive in the reverse of their due order, in two batches,
    the second due between the first's: the destination receives them in due order.

    The order is only promised among requests the scheduler holds when the first of
    them is due; a loaded machine can take longer than that to read them, so the
    attempt starts again with twice the lead until the scheduler read the second batch
    in time, and the order is asserted on that attempt."""
    destination = scheduler.destinations[2]
    for attempt, lead_ms in enumerate((8_000, 16_000, 32_000)):
        key = f"one-key-{attempt}".encode()
        reader = TopicReader(scheduler.bootstrap, [destination])
        start = now_ms()
        due: dict[bytes, int] = {}  # value -> due time
        due |= {f"{attempt}-{i}".encode(): start + lead_ms + (9 - i) * 150 for i in range(10)}
        produce(scheduler.bootstrap, scheduler.requests_topic, key_requests(key, destination, due))
        wait_for_requests(scheduler.query, requests_read(scheduler.query) + len(due))
        again = {f"{attempt}-{10 + i}".encode(): start + lead_ms + i * 300 - 100 for i in range(3)}
        due |= again
        read = requests_read(scheduler.query) + len(again)
        produce(
            scheduler.bootstrap, scheduler.requests_topic, key_requests(key, destination, again)
        )
        wait_for_requests(scheduler.query, read)
        in_time = now_ms() < min(due.values())
        got = ours(reader, due, timeout_s=120 + lead_ms / 1000)
        if in_time:
            break
    else:
        raise AssertionError(
            f"the scheduler never read the requests before the first was due ({lead_ms} ms)"
        )

    delivered = [m.value for m in got]
    assert sorted(delivered) == sorted(due)
    assert [due[v] for v in delivered] == sorted(due.values()), "not in due order"
    assert all(m.timestamp_ms >= due[m.value] for m in got), "delivered before it was due"


def ours(reader: TopicReader, due: dict[bytes, int], timeout_s: float) -> list[Received]:
    """This attempt's messages (the destination has the earlier attempts' too)."""
    deadline = Deadline(timeout_s)
    while sum(m.value in due for m in reader.received) < len(due) and not deadline.passed():
        reader.poll(0.2)
    reader.poll(1)
    reader.close()
    return [m for m in reader.received if m.value in due]


def key_requests(key: bytes, destination: str, due: dict[bytes, int]) -> list[dict[str, Any]]:
    return [
        {"key": key, "value": value, "headers": request_headers(destination, at)}
        for value, at in due.items()
    ]


def test_what_the_destination_would_refuse_for_good_is_a_dead_letter(
    scheduler: Scheduler,
) -> None:
    """Too large for the destination, or without a key for a compacted one: on arrival
    and when a timer fires, the message is a dead letter with the reason, the others
    are delivered, and the query keeps running (the Kafka sink would fail the batch,
    and every batch after a restart)."""
    small, compacted = scheduler.small, scheduler.compacted
    reader = TopicReader(scheduler.bootstrap, [scheduler.dlq_topic, small, compacted])
    now = now_ms()
    later = now + 6_000  # read while pending, delivered when its timer fires
    large = b"x" * (2 * SMALL_TOPIC_BYTES)
    cases = [
        (b"large-now", large, small, now),
        (b"large-later", large, small, later),
        (None, b"no key, now", compacted, now),
        (None, b"no key, later", compacted, later),
    ]
    records: list[dict[str, Any]] = [
        {"key": key, "value": value, "headers": request_headers(topic, due)}
        for key, value, topic, due in cases
    ]
    records += [
        {"key": b"fits", "value": b"y" * 100, "headers": request_headers(small, later)},
        {"key": b"keyed", "value": b"z", "headers": request_headers(compacted, later)},
    ]
    produce(scheduler.bootstrap, scheduler.requests_topic, records)
    ours = {key or value for key, value, _, _ in cases}  # the DLQ has other tests' too

    def letters() -> dict[bytes | None, Received]:
        found = {r.key or r.value: r for r in reader.of(scheduler.dlq_topic)}
        return {name: r for name, r in found.items() if name in ours}

    deadline = Deadline(120)
    while len(letters()) < len(ours) and not deadline.passed():
        reader.poll(0.5)
    reader.wait_for(1, timeout_s=60, topic=small)
    reader.wait_for(1, timeout_s=60, topic=compacted)
    reader.poll(1)
    reader.close()

    assert set(letters()) == ours
    for key, value, topic, _ in cases:
        letter = letters()[key or value]
        assert letter.value == value
        reason = dict(letter.headers)[DEAD_LETTER_REASON]
        assert reason is not None and reason.startswith(b"delivery refused for good: ")
        if key is None:
            assert f"destination topic {topic!r} is compacted".encode() in reason
        else:
            assert f"than destination topic {topic!r} accepts".encode() in reason
            assert f"(max.message.bytes {SMALL_TOPIC_BYTES})".encode() in reason
    assert [m.key for m in reader.of(small)] == [b"fits"]
    assert [m.key for m in reader.of(compacted)] == [b"keyed"]
    assert scheduler.query.isActive and scheduler.query.exception() is None


def test_a_request_sent_again_after_delivery_or_as_a_dead_letter_is_dropped_and_counted(
    scheduler: Scheduler,
) -> None:
    """A sender repeating itself long after the first copy left: the delivered retry is
    not delivered again, its consumer's dead letter not written again; with a key and
    without one (read elsewhere than its first copy: the check is before the buckets).
    A refused request reserves no identity: sent again, it is refused again."""
    destination = scheduler.destinations[3]
    reader = TopicReader(scheduler.bootstrap, [destination, scheduler.dlq_topic])
    failure = {"group": "g", "original_topic": "orders", "original_partition": 0}

    def request(offset: int, to: str = destination, **more: Any) -> list[Header]:
        fields = {**failure, "original_offset": offset, "attempt": 1, **more}
        identity = request_id(RetryHeaders(destination=to, retry_at=0, **fields))
        return request_headers(to, now_ms(), **fields, id=identity)

    refused = "not-allowed-" + unique("dest")  # a dead letter: not in the allowlist
    records = [
        {"key": b"keyed", "value": b"keyed", "headers": request(1)},
        {"key": None, "value": b"keyless", "headers": request(2)},
        {"key": b"given-up", "value": b"given-up", "headers": request(3, send_to="dlq")},
        {"key": b"refused", "value": b"refused", "headers": request(4, to=refused)},
    ]
    letters = (b"given-up", b"refused")

    def ours() -> list[bytes | None]:
        return sorted(m.value for m in reader.of(scheduler.dlq_topic) if m.value in letters)

    before = repeats_dropped(scheduler.query)
    try:
        produce(scheduler.bootstrap, scheduler.requests_topic, records)
        assert len(reader.wait_for(2, timeout_s=120, topic=destination)) == 2
        deadline = Deadline(60)
        while len(ours()) < 2 and not deadline.passed():
            reader.poll(0.5)
        assert ours() == [b"given-up", b"refused"]
        read = requests_read(scheduler.query)
        produce(scheduler.bootstrap, scheduler.requests_topic, records)  # again, later
        wait_for_requests(scheduler.query, read + len(records))
        deadline = Deadline(60)
        while (
            repeats_dropped(scheduler.query) - before < len(records) - 1 or len(ours()) < 3
        ) and not deadline.passed():
            reader.poll(0.2)
        reader.poll(1)
    finally:
        reader.close()
    assert repeats_dropped(scheduler.query) - before == len(records) - 1
    assert sorted(m.value for m in reader.of(destination)) == [b"keyed", b"keyless"]
    assert ours() == [b"given-up", b"refused", b"refused"]
