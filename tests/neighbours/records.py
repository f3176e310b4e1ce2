"""The test side of a neighbour's run: topics made, records written and read back raw.

Records are read by assigning every partition from the beginning (no group, so no
rebalance to wait for), once the topic is in the broker's metadata: a dead-letter
topic may be created by the program under test, after the test started reading.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from redrive.deadlines import Deadline

Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True)
class Written:
    """Where the broker put a record the test wrote, and the timestamp it carries."""

    topic: str
    partition: int
    offset: int
    timestamp: int


def create_topic(
    bootstrap: str, name: str, partitions: int = 1, config: dict[str, str] | None = None
) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, config=config or {})])
    futures[name].result(timeout=30)
    partition_count(bootstrap, name)
    return name


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def partition_count(bootstrap: str, topic: str, timeout_s: float = 60) -> int:
    """The topic's partitions, once the broker's metadata shows it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = Deadline(timeout_s)
    while True:
        found = admin.list_topics(timeout=10).topics.get(topic)
        if found is not None and found.error is None and found.partitions:
            return len(found.partitions)
        if deadline.passed():
            raise AssertionError(f"topic {topic} not in the metadata within {deadline.describe()}")
        time.sleep(0.1)


def topic_config(bootstrap: str, topic: str) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(timeout=30)
    return {name: entry.value for name, entry in entries.items()}


def write(
    bootstrap: str,
    topic: str,
    records: list[tuple[bytes | None, bytes, int, Headers]],
) -> list[Written]:
    """(key, value, partition, headers) records, in order; where each landed."""
    producer = Producer({"bootstrap.servers": bootstrap})
    written: list[Written] = []

    def delivered(error: object, message: Message) -> None:
        assert error is None, error
        _, timestamp = message.timestamp()
        written.append(Written(message.topic(), message.partition(), message.offset(), timestamp))

    for key, value, partition, headers in records:
        producer.produce(
            topic, value, key, partition=partition, headers=headers, on_delivery=delivered
        )
        assert producer.flush(30) == 0
    return written


def read(bootstrap: str, topic: str, count: int, timeout_s: float = 60) -> list[Message]:
    """The first `count` records of every partition of `topic`, by partition and offset."""
    partitions = partition_count(bootstrap, topic, timeout_s)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("reader"),
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    found: list[Message] = []
    deadline = Deadline(timeout_s)
    try:
        while len(found) < count:
            if deadline.passed():
                raise AssertionError(
                    f"{len(found)} of {count} records on {topic} within {deadline.describe()}"
                )
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            found.append(message)
    finally:
        consumer.close()
    return sorted(found, key=lambda m: (m.partition(), m.offset()))


def names(message: Message) -> list[str]:
    """The record's header names, in order, repeats kept."""
    return [name for name, _ in message.headers() or []]


def values(message: Message, name: str) -> list[bytes | None]:
    """Every value of the header `name`, in order."""
    return [value for key, value in message.headers() or [] if key == name]


def value(message: Message, name: str) -> bytes | None:
    """The one value of the header `name` (the header must appear exactly once)."""
    found = values(message, name)
    assert len(found) == 1, f"{name}: {len(found)} values in {names(message)}"
    return found[0]


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The Java producer's partition for a key: murmur2 of its bytes, made positive,
    modulo the partitions (what its default partitioner does with a keyed record)."""
    m = 0x5BD1E995
    h = (0x9747B28C ^ len(key)) & 0xFFFFFFFF
    whole = len(key) // 4 * 4
    for i in range(0, whole, 4):
        k = int.from_bytes(key[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest = key[whole:]
    if len(rest) == 3:
        h ^= rest[2] << 16
    if len(rest) >= 2:
        h ^= rest[1] << 8
    if rest:
        h ^= rest[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions
