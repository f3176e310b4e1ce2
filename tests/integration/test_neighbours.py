"""Foreign Kafka programs against the test broker: what their dead letters carry.

Each program (tests/neighbours/java) is run once, as its users run it, and the dead
letters it writes are read back raw from its dead-letter topic: which headers, in which
order and encoding, which key, value, timestamp and partition. redrive reads these
records; these tests say what they look like on a real broker, and fail when a version
bump changes it. The programs are built once (minutes, the first time) in the
session's set-up, not inside a test's timed wait.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.neighbours.build import build
from tests.neighbours.programs import neighbour
from tests.neighbours.records import (
    create_topic,
    murmur2_partition,
    names,
    partition_count,
    read,
    topic_config,
    unique,
    value,
    values,
    write,
)

pytestmark = pytest.mark.integration

WAIT_S = 90.0
"""A quiet machine's seconds for a program to start, join its group and get as far."""


@pytest.fixture(scope="session")
def built() -> Path:
    return build()


def int32(n: int) -> bytes:
    return struct.pack(">i", n)


def int64(n: int) -> bytes:
    return struct.pack(">q", n)


def test_spring_retryable_topic_dead_letter(bootstrap: str, built: Path, tmp_path: Path) -> None:
    topic = create_topic(bootstrap, unique("spring-rt"), partitions=2)
    group = unique("spring-rt-group")
    failing, good = write(
        bootstrap,
        topic,
        [(b"k1", b"fail one", 1, [("h1", b"x")]), (b"k2", b"ok two", 0, [])],
    )
    with neighbour("spring-retryable-topic", bootstrap, topic, group, log_dir=tmp_path) as app:
        handled = app.wait_for("dlt_handler", timeout_s=WAIT_S)[0]
        calls = app.wait_for("listener", count=3, timeout_s=WAIT_S)
    assert sorted((c["kind"], c["value"]) for c in calls) == [
        ("main", "fail one"),
        ("main", "ok two"),
        ("retry", "fail one"),
    ]
    assert (handled["topic"], handled["kind"]) == (f"{topic}-dlt", "dlt")
    # Spring made its retry and dead-letter topics with the broker's default partitions.
    assert partition_count(bootstrap, f"{topic}-retry") == 1
    assert partition_count(bootstrap, f"{topic}-dlt") == 1

    [dead] = read(bootstrap, f"{topic}-dlt", 1)
    assert (dead.partition(), dead.key(), dead.value()) == (0, b"k1", b"fail one")
    # Published anew: the record's time is the dead-lettering's, the original's in a header.
    assert dead.timestamp()[1] > failing.timestamp
    assert names(dead) == [
        "h1",
        "kafka_original-topic",
        "kafka_original-partition",
        "kafka_original-offset",
        "kafka_original-timestamp",
        "kafka_original-timestamp-type",
        "kafka_dlt-original-consumer-group",
        "retry_topic-original-timestamp",
        "retry_topic-attempts",
        "retry_topic-backoff-timestamp",
        "kafka_exception-fqcn",
        "kafka_exception-cause-fqcn",
        "kafka_exception-message",
        "kafka_exception-stacktrace",
        "retry_topic-original-timestamp",
        "retry_topic-attempts",
        "retry_topic-backoff-timestamp",
    ]
    assert value(dead, "kafka_original-topic") == topic.encode()
    assert value(dead, "kafka_original-partition") == int32(1)
    assert value(dead, "kafka_original-offset") == int64(failing.offset)
    assert value(dead, "kafka_original-timestamp") == int64(failing.timestamp)
    assert value(dead, "kafka_original-timestamp-type") == b"CreateTime"
    assert value(dead, "kafka_dlt-original-consumer-group") == group.encode()
    assert value(dead, "kafka_exception-fqcn") == (
        b"org.springframework.kafka.listener.ListenerExecutionFailedException"
    )
    assert value(dead, "kafka_exception-cause-fqcn") == b"java.lang.IllegalStateException"
    assert (value(dead, "kafka_exception-message") or b"").endswith(b"refused fail one")
    # One value per hop (the retry topic's, then the dead-letter topic's): the attempts
    # a 4-byte integer, the timestamps a Java BigInteger's bytes (as short as they go).
    assert values(dead, "retry_topic-attempts") == [int32(2), int32(3)]
    original = values(dead, "retry_topic-original-timestamp")
    assert [int.from_bytes(v or b"", "big", signed=True) for v in original] == [
        failing.timestamp
    ] * 2
    assert all(len(v or b"") < 8 for v in original)
    backoffs = values(dead, "retry_topic-backoff-timestamp")
    assert all(int.from_bytes(v or b"", "big") > failing.timestamp for v in backoffs)
    assert good.partition == 0


def test_spring_default_error_handler_dead_letter(
    bootstrap: str, built: Path, tmp_path: Path
) -> None:
    topic = create_topic(bootstrap, unique("spring-eh"), partitions=2)
    # The recoverer writes to the source's partition: its topic needs as many.
    dlt = create_topic(bootstrap, f"{topic}-dlt", partitions=2)
    group = unique("spring-eh-group")
    [failing] = write(bootstrap, topic, [(b"k1", b"fail one", 1, [("h1", b"x"), ("h1", b"y")])])
    write(bootstrap, topic, [(None, b"ok two", 0, [])])
    with neighbour("spring-error-handler", bootstrap, topic, group, log_dir=tmp_path) as app:
        [dead] = read(bootstrap, dlt, 1, timeout_s=WAIT_S)
        calls = app.wait_for("listener", count=3, timeout_s=WAIT_S)
    # FixedBackOff(0, 1): the failing record is tried twice, then recovered.
    assert sorted(c["value"] for c in calls) == ["fail one", "fail one", "ok two"]
    assert (dead.partition(), dead.key(), dead.value()) == (1, b"k1", b"fail one")
    assert dead.timestamp()[1] > failing.timestamp
    assert names(dead) == [
        "h1",
        "h1",
        "kafka_dlt-exception-fqcn",
        "kafka_dlt-exception-cause-fqcn",
        "kafka_dlt-exception-message",
        "kafka_dlt-exception-stacktrace",
        "kafka_dlt-original-topic",
        "kafka_dlt-original-partition",
        "kafka_dlt-original-offset",
        "kafka_dlt-original-timestamp",
        "kafka_dlt-original-timestamp-type",
        "kafka_dlt-original-consumer-group",
    ]
    assert values(dead, "h1") == [b"x", b"y"]
    assert value(dead, "kafka_dlt-original-topic") == topic.encode()
    assert value(dead, "kafka_dlt-original-partition") == int32(1)
    assert value(dead, "kafka_dlt-original-offset") == int64(failing.offset)
    assert value(dead, "kafka_dlt-original-timestamp") == int64(failing.timestamp)
    assert value(dead, "kafka_dlt-original-timestamp-type") == b"CreateTime"
    assert value(dead, "kafka_dlt-original-consumer-group") == group.encode()
    assert value(dead, "kafka_dlt-exception-cause-fqcn") == b"java.lang.IllegalStateException"
    assert (value(dead, "kafka_dlt-exception-message") or b"").endswith(b"refused fail one")
    assert (value(dead, "kafka_dlt-exception-stacktrace") or b"").startswith(
        b"org.springframework.kafka.listener.ListenerExecutionFailedException"
    )


STREAMS_ERRORS = [
    "__streams.errors.exception",
    "__streams.errors.message",
    "__streams.errors.stacktrace",
    "__streams.errors.topic",
    "__streams.errors.partition",
    "__streams.errors.offset",
]


def test_streams_dead_letter_queue(bootstrap: str, built: Path, tmp_path: Path) -> None:
    source = create_topic(bootstrap, unique("streams-in"), partitions=4)
    output = create_topic(bootstrap, f"{source}-out")
    dlq = create_topic(bootstrap, f"{source}-dlq", partitions=4)
    thrown, undecodable, _ = write(
        bootstrap,
        source,
        [
            (b"k1", b"fail one", 1, [("h1", b"x")]),
            (b"k3", b"\xff\xfe not text", 2, [("h2", b"z")]),
            (b"k2", b"ok two", 3, []),
        ],
    )
    args = (source, output, unique("streams-app"), dlq, str(tmp_path / "state"))
    with neighbour("streams-dlq", bootstrap, *args, log_dir=tmp_path):
        dead = read(bootstrap, dlq, 2, timeout_s=WAIT_S)
        [upper] = read(bootstrap, output, 1, timeout_s=WAIT_S)
    assert upper.value() == b"OK TWO"
    by_key = {m.key(): m for m in dead}
    processing, deserialization = by_key[b"k1"], by_key[b"k3"]
    for message, original in ((processing, thrown), (deserialization, undecodable)):
        # The source record's key, value and timestamp; the producer's partition for
        # its key (not the source's); the source's headers first, then Streams'.
        assert message.timestamp()[1] == original.timestamp
        assert message.partition() == murmur2_partition(message.key() or b"", 4)
        assert value(message, "__streams.errors.topic") == source.encode()
        # Decimal text, not binary integers.
        assert value(message, "__streams.errors.partition") == str(original.partition).encode()
        assert value(message, "__streams.errors.offset") == str(original.offset).encode()
    assert processing.value() == b"fail one"
    assert names(processing) == ["h1", *STREAMS_ERRORS]
    assert value(processing, "__streams.errors.exception") == b"java.lang.IllegalStateException"
    assert value(processing, "__streams.errors.message") == b"refused fail one"
    assert (value(processing, "__streams.errors.stacktrace") or b"").startswith(
        b"java.lang.IllegalStateException: refused fail one\n\tat "
    )
    assert deserialization.value() == b"\xff\xfe not text"
    assert names(deserialization) == ["h2", *STREAMS_ERRORS]
    assert value(deserialization, "__streams.errors.exception") == (
        b"org.apache.kafka.common.errors.SerializationException"
    )


CONNECT_ERRORS = [
    "__connect.errors.topic",
    "__connect.errors.partition",
    "__connect.errors.offset",
    "__connect.errors.connector.name",
    "__connect.errors.task.id",
    "__connect.errors.stage",
    "__connect.errors.class.name",
    "__connect.errors.exception.class.name",
    "__connect.errors.exception.message",
    "__connect.errors.exception.stacktrace",
]


def test_connect_dead_letter_queue(bootstrap: str, built: Path, tmp_path: Path) -> None:
    source = create_topic(bootstrap, unique("connect-in"), partitions=4)
    dlq = create_topic(bootstrap, unique("connect-dlq"), partitions=4)
    [not_json] = write(bootstrap, source, [(b"k1", b"not json", 1, [("h1", b"x")])])
    write(bootstrap, source, [(b"k2", b'{"ok": 2}', 3, [])])
    with neighbour(
        "connect-sink", bootstrap, source, dlq, str(tmp_path / "work"), log_dir=tmp_path
    ) as connect:
        [dead] = read(bootstrap, dlq, 1, timeout_s=WAIT_S)
        [sunk] = connect.wait_for("sunk", timeout_s=WAIT_S)
    assert (sunk["key"], sunk["value"]) == ("k2", "{ok=2}")
    assert (dead.key(), dead.value()) == (b"k1", b"not json")
    assert dead.timestamp()[1] == not_json.timestamp
    assert dead.partition() == murmur2_partition(b"k1", 4)
    assert names(dead) == ["h1", *CONNECT_ERRORS]
    assert value(dead, "__connect.errors.topic") == source.encode()
    assert value(dead, "__connect.errors.partition") == b"1"
    assert value(dead, "__connect.errors.offset") == str(not_json.offset).encode()
    assert value(dead, "__connect.errors.connector.name") == b"event-sink"
    assert value(dead, "__connect.errors.task.id") == b"0"
    assert value(dead, "__connect.errors.stage") == b"VALUE_CONVERTER"
    assert value(dead, "__connect.errors.class.name") == (
        b"org.apache.kafka.connect.json.JsonConverter"
    )
    assert value(dead, "__connect.errors.exception.class.name") == (
        b"org.apache.kafka.connect.errors.DataException"
    )


SHARE_ERRORS = [
    "__dlq.errors.topic",
    "__dlq.errors.partition",
    "__dlq.errors.offset",
    "__dlq.errors.group",
    "__dlq.errors.delivery.count",
    "__dlq.errors.message",
]


def test_share_group_dead_letter_queue(bootstrap: str, built: Path, tmp_path: Path) -> None:
    """By default a share group's dead letter names the record and carries none of it;
    its topic (with the broker's "dlq." prefix) is made on first use by the dev broker."""
    source = create_topic(bootstrap, unique("share-in"), partitions=2)
    dlq = unique("dlq.share")
    group = unique("share-group")
    [rejected] = write(bootstrap, source, [(b"k1", b"fail one", 1, [("h1", b"x")])])
    write(bootstrap, source, [(b"k2", b"ok two", 0, [])])
    args = (source, group, dlq, "false")
    with neighbour("share-consumer", bootstrap, *args, log_dir=tmp_path) as consumer:
        [dead] = read(bootstrap, dlq, 1, timeout_s=WAIT_S)
        delivered = consumer.wait_for("delivered", count=2, timeout_s=WAIT_S)
    assert sorted((d["value"], d["acknowledge"]) for d in delivered) == [
        ("fail one", "REJECT"),
        ("ok two", "ACCEPT"),
    ]
    assert topic_config(bootstrap, dlq)["errors.deadletterqueue.group.enable"] == "true"
    assert (dead.key(), dead.value()) == (None, None)
    assert dead.timestamp()[1] > rejected.timestamp
    assert dead.partition() == 0
    assert names(dead) == SHARE_ERRORS
    # The topic by name (not its id), every number as decimal text.
    assert value(dead, "__dlq.errors.topic") == source.encode()
    assert value(dead, "__dlq.errors.partition") == b"1"
    assert value(dead, "__dlq.errors.offset") == str(rejected.offset).encode()
    assert value(dead, "__dlq.errors.group") == group.encode()
    assert value(dead, "__dlq.errors.delivery.count") == b"1"
    assert value(dead, "__dlq.errors.message") == b"Offset rejected by client."


def test_share_group_dead_letter_queue_with_the_record(
    bootstrap: str, built: Path, tmp_path: Path
) -> None:
    """With errors.deadletterqueue.copy.record.enable the dead letter carries the key and
    value (not the record's headers), on the source's partition of a topic made for it."""
    source = create_topic(bootstrap, unique("share-in"), partitions=4)
    dlq = create_topic(
        bootstrap,
        unique("dlq.share"),
        partitions=4,
        config={"errors.deadletterqueue.group.enable": "true"},
    )
    group = unique("share-group")
    [rejected] = write(bootstrap, source, [(b"k1", b"fail one", 2, [("h1", b"x")])])
    with neighbour("share-consumer", bootstrap, source, group, dlq, "true", log_dir=tmp_path):
        [dead] = read(bootstrap, dlq, 1, timeout_s=WAIT_S)
    assert (dead.key(), dead.value()) == (b"k1", b"fail one")
    assert dead.partition() == rejected.partition
    assert dead.timestamp()[1] > rejected.timestamp
    assert names(dead) == SHARE_ERRORS
    assert value(dead, "__dlq.errors.partition") == b"2"


def test_java_producer_partitions_keys_by_murmur2(
    bootstrap: str, built: Path, tmp_path: Path
) -> None:
    topic = create_topic(bootstrap, unique("keyed"), partitions=3)
    keys = ["a", "b", "order-17", "", "x" * 33]
    pairs = [f"{key}=v{i}" for i, key in enumerate(keys)]
    with neighbour("keyed-producer", bootstrap, topic, *pairs, log_dir=tmp_path) as producer:
        produced = producer.wait_for("produced", count=len(keys), timeout_s=WAIT_S)
        assert producer.wait_exit(timeout_s=WAIT_S) == 0
    assert [p["key"] for p in produced] == keys
    for event in produced:
        assert event["partition"] == murmur2_partition(event["key"].encode(), 3), event
    stored = read(bootstrap, topic, len(keys))
    assert sorted((m.key(), m.partition()) for m in stored) == sorted(
        (p["key"].encode(), p["partition"]) for p in produced
    )
