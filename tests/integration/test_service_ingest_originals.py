"""A dead letter that names its record without holding it (a share group's, by default)
is completed with the record read from its topic while the topic retains it, and says
that the record is unknown once it does not. The letters here carry the headers a
Kafka 4.4 broker writes to a share group's dead-letter queue; the real broker writing
them is in tests/integration/test_neighbour_letters.py."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from redrive.deadlines import Deadline
from tests.integration.service_harness import fresh_database, produce, running_service, settings_for

pytestmark = pytest.mark.integration

HEADERS: list[tuple[str, bytes | None]] = [("trace-id", b"\x00\xffabc"), ("empty", None)]


@dataclass
class Env:
    bootstrap: str
    api: httpx.Client
    operator: dict[str, str]
    original: str
    dlq: str


def _topic(admin: AdminClient, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(name, num_partitions=2)])[name].result(timeout=30)
    return name


@pytest.fixture(scope="module")
def env(bootstrap: str, database_url: str) -> Iterator[Env]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    original, dlq = _topic(admin, "share-orders"), _topic(admin, "dlq.share")
    settings = settings_for(
        bootstrap,
        fresh_database(database_url),
        allowed_destinations=[original],
        ingest=[{"topic": dlq, "format": "auto"}],
    )
    with (
        running_service(settings) as service,
        httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as api,
    ):
        operator = {"Authorization": f"Bearer {service.tokens.create('olga', 'operator')}"}
        yield Env(bootstrap, api, operator, original, dlq)


def _letter_for(env: Env, partition: int, offset: int) -> dict[str, Any]:
    """Write the broker's share-group letter for ``original[partition]@offset`` (no copy
    of the record) and wait for its dead letter."""
    marker = uuid.uuid4().hex
    headers = [
        ("__dlq.errors.topic", env.original.encode()),
        ("__dlq.errors.partition", str(partition).encode()),
        ("__dlq.errors.offset", str(offset).encode()),
        ("__dlq.errors.group", marker.encode()),
        ("__dlq.errors.message", b"Offset rejected by client."),
        ("__dlq.errors.delivery.count", b"1"),
    ]
    produce(env.bootstrap, env.dlq, [{"key": None, "value": None, "headers": headers}])
    deadline = Deadline(30)
    while True:
        items = env.api.get("/api/v1/dead-letters", params={"group": marker}).json()["items"]
        if items:
            detail: dict[str, Any] = env.api.get(f"/api/v1/dead-letters/{items[0]['id']}").json()
            return detail
        assert not deadline.passed(), "the share group's letter was not ingested"
        time.sleep(0.2)


def _produced(env: Env, key: bytes, value: bytes) -> tuple[int, int]:
    """Produce one record to partition 1 of the original topic; its offset."""
    before = _high(env)
    produce(
        env.bootstrap,
        env.original,
        [{"key": key, "value": value, "headers": HEADERS, "partition": 1, "timestamp": 1_234}],
    )
    return 1, before


def _high(env: Env, partition: int = 1) -> int:
    consumer = Consumer({"bootstrap.servers": env.bootstrap, "group.id": "unused"})
    try:
        tp = TopicPartition(env.original, partition)
        _, high = consumer.get_watermark_offsets(tp, timeout=10)
        return int(high)
    finally:
        consumer.close()


def _written(env: Env) -> int:
    """Records in the original topic, both partitions."""
    return _high(env, 0) + _high(env, 1)


def test_a_letter_without_its_record_gets_it_from_its_topic(env: Env) -> None:
    partition, offset = _produced(env, b"k-1", b"the record \xff")
    letter = _letter_for(env, partition, offset)
    assert base64.b64decode(letter["key"]["base64"]) == b"k-1"
    assert base64.b64decode(letter["value"]["base64"]) == b"the record \xff"
    assert [h["name"] for h in letter["headers"]] == ["trace-id", "empty"]
    assert letter["original"]["timestamp"] is not None
    assert letter["original"]["partition"] == partition
    assert letter["original"]["offset"] == offset
    assert letter["source"] == "ingest:share-group"
    assert letter["error_message"] == "Offset rejected by client."
    assert letter["attempt"] == 1
    assert letter["reason"].endswith(f"; its record read from {env.original}[1]@{offset}")


def test_a_letter_whose_record_is_gone_says_so(env: Env) -> None:
    partition, offset = _produced(env, b"k-2", b"gone soon")
    admin = AdminClient({"bootstrap.servers": env.bootstrap})
    [future] = admin.delete_records([TopicPartition(env.original, partition, offset + 1)]).values()
    future.result(timeout=30)  # the retention that passed
    letter = _letter_for(env, partition, offset)
    assert letter["key"] is None and letter["value"] is None
    assert letter["headers"] == []
    assert letter["topic"] == env.original and letter["original"]["offset"] == offset
    assert letter["reason"].endswith(
        f"; the record is no longer in {env.original}[1]@{offset}: "
        "its key, value and headers are unknown"
    )


def test_a_letter_whose_record_is_gone_is_never_replayed_as_an_empty_record(env: Env) -> None:
    """Refused alone (409) unless a value is given, skipped by a job with why, and
    counted as skipped by both dry runs: nothing is written to its topic until the
    operator gives the value."""
    partition, offset = _produced(env, b"k-3", b"gone before it was read")
    admin = AdminClient({"bootstrap.servers": env.bootstrap})
    [future] = admin.delete_records([TopicPartition(env.original, partition, offset + 1)]).values()
    future.result(timeout=30)
    letter = _letter_for(env, partition, offset)
    assert letter["record_missing"] is True
    letter_id, before = letter["id"], _written(env)
    one = f"/api/v1/dead-letters/{letter_id}/replay"

    refused = env.api.post(one, json={}, headers=env.operator)
    assert refused.status_code == 409, refused.text
    assert "its record is unknown" in refused.json()["detail"]
    dry = env.api.post(f"{one}/dry-run", json={}, headers=env.operator).json()
    assert dry["would_send"] == 0
    assert [s["dead_letter_id"] for s in dry["skipped"]] == [letter_id]
    many = {"ids": [letter_id]}
    dry = env.api.post("/api/v1/dead-letters/replay/dry-run", json=many, headers=env.operator)
    assert dry.json()["would_send"] == 0 and len(dry.json()["skipped"]) == 1

    started = env.api.post("/api/v1/dead-letters/replay", json=many, headers=env.operator)
    assert started.status_code == 202, started.text
    job_url = "/api/v1/jobs/" + str(started.json()["job"]["id"])
    deadline = Deadline(30)
    while (job := env.api.get(job_url, headers=env.operator).json())["state"] == "running":
        assert not deadline.passed(), f"the job did not end: {job}"
        time.sleep(0.2)
    assert (job["state"], job["sent"], job["skipped"]) == ("done", 0, 1)
    assert "its record is unknown" in job["failures"][0]["error"]
    assert _written(env) == before, "nothing written for a letter without its record"

    given = {"value": {"text": "rebuilt by the operator"}}
    replayed = env.api.post(one, json=given, headers=env.operator)
    assert replayed.status_code == 200, replayed.text
    assert _written(env) == before + 1
