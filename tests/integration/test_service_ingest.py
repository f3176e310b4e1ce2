"""Dead-letter topics ingested into the store (the ``ingest`` setting; issue 19): a
record of each format, written with the headers those systems write (Spring's
partition a 4-byte int and offset an 8-byte long, big-endian; Connect's strings;
redrive's own contract; none at all), appears in the API and the UI with its original
coordinates and error, filterable by source and by the topic it came from; a replay
delivers it to its original topic with its key, value and user headers byte for
byte, and the foreign metadata removed; read twice, it is one dead letter."""

from __future__ import annotations

import struct
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from redrive.deadlines import Deadline
from redrive.service.service import RetryService
from tests.integration.service_harness import (
    Collector,
    dead_letters,
    fresh_database,
    now_ms,
    produce,
    request_headers,
    running_service,
    settings_for,
)

pytestmark = pytest.mark.integration

USER_HEADERS: list[tuple[str, bytes | None]] = [
    ("trace-id", b"\x00\xffabc"),
    ("tenant", b"acme"),
    ("empty", None),
]
KEY = b"order-42"
VALUE = b'{"id": 42, "note": "\xc3\xa9t\xc3\xa9"}'


def spring_headers(original: str) -> list[tuple[str, bytes | None]]:
    """As Spring Kafka's DeadLetterPublishingRecoverer writes them."""
    return [
        ("kafka_dlt-original-topic", original.encode()),
        ("kafka_dlt-original-partition", struct.pack(">i", 2)),
        ("kafka_dlt-original-offset", struct.pack(">q", 12345)),
        ("kafka_dlt-original-timestamp", struct.pack(">q", 1_700_000_000_000)),
        ("kafka_dlt-original-timestamp-type", b"CreateTime"),
        ("kafka_dlt-original-consumer-group", b"billing"),
        (
            "kafka_dlt-exception-fqcn",
            b"org.springframework.kafka.listener.ListenerExecutionFailedException",
        ),
        ("kafka_dlt-exception-cause-fqcn", b"java.lang.IllegalStateException"),
        ("kafka_dlt-exception-message", b"Listener failed; bad item 42"),
        (
            "kafka_dlt-exception-stacktrace",
            b"java.lang.IllegalStateException: bad item 42\n\tat A.b(A.java:1)",
        ),
    ]


def connect_headers(original: str) -> list[tuple[str, bytes | None]]:
    """As Kafka Connect's dead-letter queue reporter writes them (context headers on)."""
    return [
        ("__connect.errors.topic", original.encode()),
        ("__connect.errors.partition", b"2"),
        ("__connect.errors.offset", b"12345"),
        ("__connect.errors.connector.name", b"jdbc-sink"),
        ("__connect.errors.task.id", b"0"),
        ("__connect.errors.stage", b"VALUE_CONVERTER"),
        ("__connect.errors.class.name", b"org.apache.kafka.connect.json.JsonConverter"),
        ("__connect.errors.exception.class.name", b"org.apache.kafka.connect.errors.DataException"),
        ("__connect.errors.exception.message", b"Converting byte[] to Kafka Connect data failed"),
        (
            "__connect.errors.exception.stacktrace",
            b"org.apache.kafka.connect.errors.DataException: ...",
        ),
    ]


def redrive_headers(original: str) -> list[tuple[str, bytes | None]]:
    """As an App with strategy topics writes a dead letter to <topic>.dlq."""
    return request_headers(
        original,
        now_ms(),
        send_to="dlq",
        attempt=3,
        group="billing",
        error_type="billing.Timeout",
        error_message="gateway timed out",
        original_topic=original,
        original_partition=2,
        original_offset=12345,
        reason="attempts exhausted (3 of 3)",
    )


@dataclass
class Case:
    format: str
    headers: Callable[[str], list[tuple[str, bytes | None]]]
    error_type: str | None
    error_text: str | None
    group: str | None


CASES = [
    Case(
        "spring",
        spring_headers,
        "java.lang.IllegalStateException",  # the cause, not Spring's wrapper
        "bad item 42",
        "billing",
    ),
    Case(
        "connect",
        connect_headers,
        "org.apache.kafka.connect.errors.DataException",
        "Converting byte[]",
        None,
    ),
    Case("redrive", redrive_headers, "billing.Timeout", "gateway timed out", "billing"),
    Case("raw", lambda original: [], None, None, None),
]


@dataclass
class Env:
    service: RetryService
    api: httpx.Client
    operator: dict[str, str]
    bootstrap: str
    original: str
    dlqs: dict[str, str]


def _topic(bootstrap: str, prefix: str, partitions: int = 1) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=partitions)])[name].result(timeout=30)
    return name


@pytest.fixture(scope="module")
def env(bootstrap: str, database_url: str) -> Iterator[Env]:
    """One service for the module, ingesting a topic of each format."""
    original = _topic(bootstrap, "ingest-orders", partitions=3)
    dlqs = {case.format: _topic(bootstrap, f"ingest-{case.format}-dlq") for case in CASES}
    dlqs["twice"] = _topic(bootstrap, "ingest-twice-dlq")  # never replayed
    dlqs["late"] = f"ingest-late-dlq-{uuid.uuid4().hex[:10]}"  # created after start-up
    settings = settings_for(
        bootstrap,
        fresh_database(database_url),
        allowed_destinations=[original],
        replay_rate_per_second=2000,
        # raw explicitly, the others recognised by their headers
        ingest=[
            {"topic": dlqs["raw"], "format": "raw"},
            *({"topic": dlqs[f], "format": "auto"} for f in ("spring", "connect", "redrive")),
            {"topic": dlqs["twice"], "format": "spring"},
            {"topic": dlqs["late"], "format": "redrive"},
        ],
    )
    with running_service(settings) as service:
        operator = {"Authorization": f"Bearer {service.tokens.create('olivia', 'operator')}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as api:
            yield Env(service, api, operator, bootstrap, original, dlqs)


def listed(env: Env, **params: str) -> list[dict[str, Any]]:
    response = env.api.get("/api/v1/dead-letters", params=params)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def wait_listed(env: Env, count: int, **params: str) -> list[dict[str, Any]]:
    deadline = Deadline(30)
    while len(items := listed(env, **params)) < count and not deadline.passed():
        time.sleep(0.2)
    assert len(items) == count, items
    return items


@pytest.mark.parametrize("case", CASES, ids=[c.format for c in CASES])
def test_a_dead_letter_of_each_format_is_ingested_shown_and_replayed_byte_for_byte(
    env: Env, case: Case
) -> None:
    dlq = env.dlqs[case.format]
    headers = [*USER_HEADERS, *case.headers(env.original)]
    key = KEY + b"-" + case.format.encode()  # the replays share the original topic
    record = {"key": key, "value": VALUE, "headers": headers}
    produce(env.bootstrap, dlq, [record])
    [item] = wait_listed(env, 1, ingested_from=dlq)
    assert listed(env, source=f"ingest:{case.format}", ingested_from=dlq) == [item]
    detail = env.api.get(f"/api/v1/dead-letters/{item['id']}").json()
    assert detail["source"] == f"ingest:{case.format}"
    assert detail["request"]["topic"] == dlq
    if case.format == "raw":
        assert detail["original"]["topic"] is None  # no metadata: nowhere to replay to
        assert detail["topic"] is None
    else:
        assert detail["topic"] == env.original
        assert detail["original"] == {
            "topic": env.original,
            "partition": 2,
            "offset": 12345,
            "timestamp": detail["original"]["timestamp"],
        }
        assert detail["error_type"] == case.error_type
        assert case.error_text is not None and case.error_text in (detail["error_message"] or "")
        assert detail["group"] == case.group
    # The foreign metadata is not among the headers kept: only the user's.
    kept = [h["name"] for h in detail["headers"]]
    assert kept == [name for name, _ in USER_HEADERS]
    # The page shows where it came from.
    page = env.api.get(f"/dead-letters/{item['id']}")
    assert page.status_code == 200
    assert f"ingest:{case.format}" in page.text and dlq in page.text

    if case.format == "raw":
        refused = env.api.post(f"/api/v1/dead-letters/{item['id']}/replay", headers=env.operator)
        assert refused.status_code in (400, 409, 422), refused.text  # no topic to go to
        return
    collector = Collector(env.bootstrap, env.original)
    try:
        replayed = env.api.post(f"/api/v1/dead-letters/{item['id']}/replay", headers=env.operator)
        assert replayed.status_code == 200, replayed.text
        deadline = Deadline(20)
        while not (mine := [d for d in collector.received if d.key == key]):
            assert not deadline.passed(), "the replay did not arrive"
            collector.poll_until(len(collector.received) + 1, 1)
    finally:
        collector.close()
    [delivery] = mine
    assert delivery.value == VALUE
    assert [(n, v) for n, v in delivery.headers if not n.startswith("redrive-")] == USER_HEADERS


def test_a_record_read_twice_is_one_dead_letter(env: Env) -> None:
    """The same DLQ record ingested again (another service, another consumer group,
    same store): the unique index on its DLQ coordinates keeps it one dead letter."""
    dlq = env.dlqs["twice"]
    record = {"key": KEY, "value": VALUE, "headers": spring_headers(env.original)}
    produce(env.bootstrap, dlq, [record])
    wait_listed(env, 1, ingested_from=dlq)
    before = len(dead_letters(env.service.database_url))
    settings = settings_for(
        env.bootstrap,
        env.service.database_url,
        allowed_destinations=[env.original],
        ingest=[{"topic": dlq, "format": "spring"}],
        roles=["intake"],
    )
    with running_service(settings) as again:

        def sample(name: str) -> float | None:
            value = again.metrics.registry.get_sample_value(name, {"format": "spring"})
            return None if value is None else float(value)

        deadline = Deadline(10)
        while not deadline.passed() and sample("redrive_dead_letters_read_again_total") is None:
            time.sleep(0.2)
        # Read again and counted as such, not as a letter made.
        assert sample("redrive_dead_letters_read_again_total") == 1, "not read again"
        assert not sample("redrive_dead_letters_ingested_total")
    assert len(dead_letters(env.service.database_url)) == before
    assert len(listed(env, ingested_from=dlq)) == 1


def test_a_dead_letter_topic_created_after_start_up_is_read_within_seconds(env: Env) -> None:
    """As a share group's broker DLQ, or a Spring DLT, is created on first use: the
    service, already running, reads its first letter within seconds (a metadata
    refresh of its own, not librdkafka's five minutes)."""
    late = env.dlqs["late"]
    assert listed(env, ingested_from=late) == []
    admin = AdminClient({"bootstrap.servers": env.bootstrap})
    admin.create_topics([NewTopic(late, num_partitions=1)])[late].result(timeout=30)
    produce(
        env.bootstrap,
        late,
        [{"key": KEY, "value": VALUE, "headers": redrive_headers(env.original)}],
    )
    deadline = Deadline(10)
    while not (found := listed(env, ingested_from=late)) and not deadline.passed():
        time.sleep(0.2)
    assert len(found) == 1, f"not ingested within {deadline.describe()}"
    assert found[0]["error_type"] == "billing.Timeout"
