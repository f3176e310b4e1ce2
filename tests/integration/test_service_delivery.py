"""The retry service delivers on time, with the message intact."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from redrive.deadlines import Deadline
from redrive.headers import RetryHeaders, decode, request_id
from tests.integration.service_harness import (
    Collector,
    dead_letters,
    fresh_database,
    now_ms,
    pending_count,
    produce,
    request_headers,
    running_service,
    settings_for,
    wait_until,
)


def request_id_of(fields: dict[str, object]) -> str:
    return request_id(RetryHeaders(destination="any", retry_at=0, **fields))  # type: ignore[arg-type]


pytestmark = pytest.mark.integration


def test_request_due_in_2s_arrives_on_time_intact_and_on_its_partition(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    destination = new_topic("orders", partitions=3)
    db = fresh_database(database_url)
    settings = settings_for(bootstrap, db, allowed_destinations=[destination])
    with running_service(settings):
        collector = Collector(bootstrap, destination)
        collector.poll_until(1, 1.0)  # join the group before anything is due
        due = now_ms() + 2_000
        user_headers = [("trace-id", b"\x00\xffabc"), ("tenant", b"acme")]
        headers = request_headers(
            destination,
            due,
            user_headers=user_headers,
            partition=2,
            attempt=1,
            group="billing",
            original_topic=destination,
            original_partition=0,
            original_offset=17,
            error_type="billing.Unavailable",
            error_message="503",
        )
        produce(
            bootstrap,
            settings.requests_topic,
            [{"key": b"order-42", "value": b"\x01\x02 payload", "headers": headers}],
        )
        deliveries = collector.poll_until(1, 10.0)
        collector.close()

    assert len(deliveries) == 1
    got = deliveries[0]
    lateness = got.received_ms - due
    assert lateness >= 0, f"delivered {-lateness} ms before it was due"
    assert lateness <= 200, f"delivered {lateness} ms after it was due"
    assert got.key == b"order-42"
    assert got.value == b"\x01\x02 payload"
    assert got.partition == 2
    # The delivered message carries the request's headers unchanged: the user's own
    # first, byte for byte, then the redrive ones the handler reads its attempt from.
    assert got.headers == headers
    request, users = decode(got.headers)
    assert users == user_headers
    assert request.attempt == 1 and request.original_offset == 17
    assert pending_count(db) == 0


def test_without_partition_the_key_decides_like_any_producer(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    destination = new_topic("keyed", partitions=4)
    db = fresh_database(database_url)
    settings = settings_for(bootstrap, db, allowed_destinations=[destination])
    due = now_ms() + 500
    records = [
        {
            "key": f"k{i % 5}".encode(),
            "value": f"v{i}".encode(),
            "headers": request_headers(destination, due + i),
        }
        for i in range(50)
    ]
    with running_service(settings):
        produce(bootstrap, settings.requests_topic, records)
        collector = Collector(bootstrap, destination)
        deliveries = collector.poll_until(50, 20.0)
        collector.close()
    assert len(deliveries) == 50
    partitions_by_key: dict[bytes | None, set[int]] = {}
    for d in deliveries:
        partitions_by_key.setdefault(d.key, set()).add(d.partition)
    assert all(len(parts) == 1 for parts in partitions_by_key.values())


# What the test producers may send: a 1,000,000-byte value with its record around it
# is above librdkafka's default message.max.bytes (1,000,000), but within what the
# broker accepts by default on a topic (1,048,588).
BIG_PRODUCER = {"message.max.bytes": 1_048_588}


def test_a_request_as_large_as_the_requests_topic_accepts_is_delivered_byte_exact(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    # Whatever intake can receive the scheduler must be able to send: its producer's
    # limit follows the requests topic's, not librdkafka's lower default.
    destination = new_topic("large")
    db = fresh_database(database_url)
    settings = settings_for(bootstrap, db, allowed_destinations=[destination])
    value = os.urandom(1_000_000)
    due = now_ms() + 500
    with running_service(settings):
        collector = Collector(bootstrap, destination)
        produce(
            bootstrap,
            settings.requests_topic,
            [{"key": b"big", "value": value, "headers": request_headers(destination, due)}],
            config=BIG_PRODUCER,
        )
        deliveries = collector.poll_until(1, 30.0)
        collector.close()
    assert dead_letters(db) == []
    assert [(d.key, len(d.value or b"")) for d in deliveries] == [(b"big", 1_000_000)]
    assert deliveries[0].value == value, "delivered byte for byte"
    assert deliveries[0].received_ms >= due
    assert pending_count(db) == 0


def test_a_message_its_destination_refuses_for_good_becomes_a_dead_letter(
    bootstrap: str, database_url: str
) -> None:
    # A destination whose messages may not exceed 2 KiB: a 10 KB retry can never be
    # delivered there, however often it is tried, so it must not stay pending. Nor can
    # a 1,000,000-byte one, which the broker, not the scheduler's producer, must judge.
    destination = f"small-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics(
        [NewTopic(destination, num_partitions=1, config={"max.message.bytes": "2048"})]
    )
    created[destination].result(30)
    db = fresh_database(database_url)
    settings = settings_for(bootstrap, db, allowed_destinations=[destination])
    due = now_ms() + 300
    records = [
        {"key": b"big", "value": os.urandom(10_000), "headers": request_headers(destination, due)},
        {"key": b"small", "value": b"fits", "headers": request_headers(destination, due + 1)},
        {
            "key": b"huge",
            "value": os.urandom(1_000_000),
            "headers": request_headers(destination, due + 2),
        },
        *(
            {
                "key": f"after-{i}".encode(),
                "value": b"fits",
                "headers": request_headers(destination, due + 3 + i),
            }
            for i in range(3)
        ),
    ]
    with running_service(settings):
        collector = Collector(bootstrap, destination)
        collector.poll_until(1, 1.0)
        produce(bootstrap, settings.requests_topic, records, config=BIG_PRODUCER)
        deliveries = collector.poll_until(4, 15.0)
        deadline = Deadline(15)
        while len(dead_letters(db)) < 2 and not deadline.passed():
            time.sleep(0.2)
        collector.close()
    # The scheduler goes on delivering what follows a message it could not deliver.
    # (In any order: a batch the broker refused whole is produced again one by one.)
    assert sorted(d.key or b"" for d in deliveries) == [
        b"after-0",
        b"after-1",
        b"after-2",
        b"small",
    ]
    letters = dead_letters(db)
    assert [(bytes(d["msg_key"]), d["reason_code"], d["source"]) for d in letters] == [
        (b"big", "delivery_failed", "scheduler"),
        (b"huge", "delivery_failed", "scheduler"),
    ]
    for letter, record in zip(letters, (records[0], records[2]), strict=True):
        # The destination's broker refused it (not the scheduler's own producer, whose
        # refusal reads "Unable to produce message: ..."), and the reason says so.
        assert letter["reason"].endswith(": Broker: Message size too large"), letter["reason"]
        assert destination in letter["reason"]
        assert bytes(letter["msg_value"]) == record["value"], "kept whole"
    assert pending_count(db) == 0, "nothing stays pending, retried forever"


def test_a_request_sent_again_after_delivery_or_as_a_dead_letter_is_dropped_and_counted(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    """Senders repeat themselves after a crash, long after the first copy is gone: the
    repeat of a delivered retry is not delivered again, nor a dead letter stored twice."""
    destination = new_topic("orders")
    db = fresh_database(database_url)
    settings = settings_for(bootstrap, db, allowed_destinations=[destination])
    failure = {
        "group": "billing",
        "original_topic": destination,
        "original_partition": 0,
        "original_offset": 17,
        "attempt": 2,
    }
    retry = request_headers(destination, now_ms(), **failure, id=request_id_of(failure))
    # Its failure's next one, given up on: a dead letter with its own identity.
    spent = {**failure, "attempt": 3}
    letter = request_headers(
        destination, now_ms(), **spent, send_to="dlq", reason="attempts exhausted"
    )
    with running_service(settings) as service:
        collector = Collector(bootstrap, destination)

        def repeats(stage: str) -> float:
            sample = service.exposed_metrics.get_sample_value(
                "redrive_requests_repeated_total", {"stage": stage}
            )
            return sample or 0.0

        requests = settings.requests_topic
        produce(bootstrap, requests, [{"key": b"k", "value": b"v", "headers": retry}])
        assert len(collector.poll_until(1, 30.0)) == 1
        wait_until(lambda: pending_count(db) == 0, 30, "the first copy settled")
        produce(bootstrap, requests, [{"key": b"k", "value": b"v", "headers": letter}])
        wait_until(lambda: len(dead_letters(db)) == 1, 30, "the dead letter stored")
        produce(
            bootstrap,
            requests,
            [
                {"key": b"k", "value": b"v", "headers": retry},
                {"key": b"k", "value": b"v", "headers": letter},
            ],
        )
        wait_until(lambda: repeats("retry") == 1, 30, "the retry's repeat counted")
        wait_until(lambda: repeats("dead_letter") == 1, 30, "the letter's repeat counted")
        # Both were read and dropped: nothing more can come of them.
        received = collector.poll_until(2, 1.0)
        collector.close()
    assert len(received) == 1
    assert len(dead_letters(db)) == 1
    assert pending_count(db) == 0
