"""A record's story: delivered retries are kept as history, and a search by key or by
original coordinates finds a record across pending retries, history and dead
letters, with every attempt, error and delay; history is pruned past retention."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from redrive import App, Message
from redrive.service.history import history_pruner
from redrive.service.store import Store
from tests.integration.consumer_harness import Calls, retry_service, running_app, wait_for
from tests.integration.service_harness import dead_letters, produce, wait_until

pytestmark = pytest.mark.integration


class Flaky(Exception):
    pass


def records(api: httpx.Client, **query: Any) -> list[dict[str, Any]]:
    response = api.get("/api/v1/records", params=query)
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["records"]
    return found


def test_a_record_failing_twice_then_delivered_tells_its_story(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("story", partitions=2)
    calls = Calls()
    origins: dict[bytes, tuple[int, int]] = {}  # value: (partition, offset) on its first try

    def handler(message: Message) -> None:
        calls.add(message)
        if message.attempt == 1:
            origins[message.raw_value] = (message.partition, message.offset)
        if message.value == b"fatal":
            raise KeyError("no such order")
        if message.attempt < 3:
            raise Flaky(f"gateway timed out on attempt {message.attempt}")

    with retry_service(bootstrap, database_url, allowed_destinations=[topic]) as service:
        app = App(
            bootstrap,
            group=f"g-{uuid.uuid4().hex[:8]}",
            requests_topic=service.settings.requests_topic,
        )
        app.add_handler(
            topic, handler, policy="300ms, 600ms", strategy="service", fatal_on=[KeyError]
        )
        with running_app(app):
            produce(
                bootstrap,
                topic,
                [
                    {"key": b"order-42", "value": b"flaky"},
                    {"key": b"order-43", "value": b"fatal"},
                ],
            )
            assert calls.wait_for(lambda: len(calls.of(b"flaky")) >= 3, 30)
            wait_until(lambda: len(dead_letters(service.database_url)) == 1, 20, "the dead letter")
        base = f"http://127.0.0.1:{service.http_port}"
        with httpx.Client(base_url=base, timeout=30) as api:

            def told() -> bool:
                found = records(api, key="order-42")
                return (
                    len(found) == 1
                    and (found[0]["state"], found[0]["attempts"]) == ("delivered", 3)
                    and [e["event"] for e in found[0]["events"]]
                    == ["failed", "scheduled", "delivered"] * 2
                )

            # The third delivery is recorded once the broker acknowledged it, which may
            # be after the handler saw it.
            wait_for(told, 30)
            [story] = records(api, key="order-42")
            assert (story["topic"], story["partition"], story["offset"]) == (
                topic,
                *origins[b"flaky"],
            )
            assert (story["state"], story["attempts"]) == ("delivered", 3)
            assert story["key"]["text"] == "order-42"
            kinds = [e["event"] for e in story["events"]]
            assert kinds == ["failed", "scheduled", "delivered"] * 2
            failed = [e for e in story["events"] if e["event"] == "failed"]
            assert [e["attempt"] for e in failed] == [1, 2]
            assert [e["error_message"] for e in failed] == [
                "gateway timed out on attempt 1",
                "gateway timed out on attempt 2",
            ]
            assert all(e["error_type"].endswith("Flaky") for e in failed)
            scheduled = [e for e in story["events"] if e["event"] == "scheduled"]
            assert [e["attempt"] for e in scheduled] == [2, 3]
            # Due at the policy's delays after the failure: at most that long after the
            # service received the request (negative: it arrived when already due).
            assert scheduled[0]["delay_ms"] <= 300 and scheduled[1]["delay_ms"] <= 600
            delivered = [e for e in story["events"] if e["event"] == "delivered"]
            assert all(d["at_ms"] >= s["due_ms"] for d, s in zip(delivered, scheduled, strict=True))
            # The same record by its original coordinates.
            by_place = records(
                api, topic=topic, partition=story["partition"], offset=story["offset"]
            )
            assert by_place == [story]

            [dead] = records(api, key="order-43")
            assert (dead["state"], dead["attempts"]) == ("dead", 1)
            assert [e["event"] for e in dead["events"]] == ["failed", "dead_letter"]
            assert (
                dead["events"][1]["dead_letter_id"] == dead_letters(service.database_url)[0]["id"]
            )

            assert records(api, key="order-44") == []
            assert len(records(api, topic=topic)) == 2
            for bad in ({}, {"partition": "1"}, {"key": "a", "key_base64": "YQ=="}):
                refused = api.get("/api/v1/records", params=bad)
                assert refused.status_code == 400, (bad, refused.text)
            for malformed in ({"topic": topic, "partition": "-1"}, {"key_base64": "#"}):
                refused = api.get("/api/v1/records", params=malformed)
                assert refused.status_code == 422, (malformed, refused.text)
            assert records(api, key_base64="b3JkZXItNDI=") == [story]  # "order-42"


def retried_once(
    bootstrap: str, database_url: str, topic: str, keys: list[bytes], **settings: Any
) -> Store:
    """Each key's record fails once and is retried through a service; returns the
    service's store (closed: open it again to read)."""
    calls = Calls()

    def handler(message: Message) -> None:
        calls.add(message)
        if message.attempt == 1:
            raise Flaky("once")

    with retry_service(
        bootstrap, database_url, allowed_destinations=[topic], **settings
    ) as service:
        app = App(
            bootstrap,
            group=f"g-{uuid.uuid4().hex[:8]}",
            requests_topic=service.settings.requests_topic,
        )
        app.add_handler(topic, handler, policy="100ms", strategy="service")
        with running_app(app):
            produce(bootstrap, topic, [{"key": key, "value": b"v"} for key in keys])
            assert calls.wait_for(lambda: len(calls.items) >= 2 * len(keys), 30)
        return Store(service.database_url)


def test_history_is_pruned_past_retention_a_batch_at_a_time(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("pruned")
    store = retried_once(bootstrap, database_url, topic, [f"k{i}".encode() for i in range(5)])
    store.open()
    try:
        kept = history_pruner(store, 3600, threading.Event(), batch=2)
        assert kept.prune() == 0  # delivered within the hour: kept
        assert len(store.record_steps(topic=topic)) == 5
        pruner = history_pruner(store, 0, threading.Event(), batch=2)
        assert pruner.prune() == 5  # three batches: 2, 2, 1
        assert store.record_steps(topic=topic) == []
    finally:
        store.close()


def test_without_history_a_delivered_retry_leaves_no_trace(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("no-history")
    store = retried_once(bootstrap, database_url, topic, [b"k"], history_retention_days=0)
    store.open()
    try:
        assert store.record_steps(key=b"k") == []
    finally:
        store.close()
