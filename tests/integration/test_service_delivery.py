"""The retry service delivers on time, with the message intact."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from redrive.headers import decode
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
)

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


def test_a_message_its_destination_refuses_for_good_becomes_a_dead_letter(
    bootstrap: str, database_url: str
) -> None:
    # A destination whose messages may not exceed 2 KiB: a 10 KB retry can never be
    # delivered there, however often it is tried, so it must not stay pending.
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
    ]
    with running_service(settings):
        collector = Collector(bootstrap, destination)
        collector.poll_until(1, 1.0)
        produce(bootstrap, settings.requests_topic, records)
        deliveries = collector.poll_until(1, 15.0)
        deadline = time.monotonic() + 15
        while not dead_letters(db) and time.monotonic() < deadline:
            time.sleep(0.2)
        collector.close()
    assert [d.key for d in deliveries] == [b"small"], "the small one was delivered"
    letters = dead_letters(db)
    assert [(bytes(d["msg_key"]), d["reason_code"], d["source"]) for d in letters] == [
        (b"big", "delivery_failed", "scheduler")
    ]
    assert "too large" in letters[0]["reason"].lower() or "size" in letters[0]["reason"].lower()
    assert bytes(letters[0]["msg_value"]) == records[0]["value"], "kept whole"
    assert pending_count(db) == 0, "nothing stays pending, retried forever"
