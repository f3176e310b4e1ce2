"""Where librdkafka's partitioners put keys: what the placement tests compare with;
and where records landed.

A producer configured with the partitioner writes the keys to a topic of its own with
as many partitions, and its delivery reports say where each went: librdkafka hashes
the keys, never this module (a key's partition depends on the key and the partition
count alone).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from redrive.deadlines import Deadline
from redrive.partitioners import Partitioner, placed_by
from tests.conftest import wait_for_topics
from tests.integration.service_harness import Collector, Delivery

JAVA = Partitioner.MURMUR2_RANDOM
LIBRDKAFKA = Partitioner.CONSISTENT_RANDOM


def placement(
    bootstrap: str, keys: Sequence[bytes], partitions: int, partitioner: Partitioner
) -> dict[bytes, int]:
    """The partition ``partitioner`` puts each key on, on a topic of ``partitions``."""
    topic = f"placement-{partitioner.value}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result(timeout=30)
    wait_for_topics(admin, [topic])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **placed_by(partitioner)})
    placed: dict[bytes, int] = {}

    def delivered(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        key = msg.key()
        assert isinstance(key, bytes)
        placed[key] = msg.partition() or 0

    for key in keys:
        producer.produce(topic, b"", key, on_delivery=delivered)
    assert producer.flush(60) == 0
    producer.close()
    assert set(placed) == set(keys)
    return placed


@dataclass(frozen=True)
class KeysApart:
    """Keys that the Java placement and librdkafka's default put on different
    partitions of a topic of ``partitions``: a record among them lands where only one
    of the two would put it."""

    keys: list[bytes]
    java: dict[bytes, int]
    librdkafka: dict[bytes, int]

    def elsewhere(self, key: bytes, turn: int, partitions: int) -> int:
        """A partition neither placement gives ``key`` (the ``turn``-th such, round)."""
        taken = {self.java[key], self.librdkafka[key]}
        free = [p for p in range(partitions) if p not in taken]
        return free[turn % len(free)]


def keys_apart(bootstrap: str, partitions: int, count: int, prefix: str) -> KeysApart:
    """``count`` keys ``<prefix>-<n>`` that the two placements disagree on."""
    candidates = [f"{prefix}-{n}".encode() for n in range(count * 4)]
    java = placement(bootstrap, candidates, partitions, JAVA)
    librdkafka = placement(bootstrap, candidates, partitions, LIBRDKAFKA)
    keys = [k for k in candidates if java[k] != librdkafka[k]][:count]
    assert len(keys) == count, f"only {len(keys)} of {len(candidates)} keys placed apart"
    return KeysApart(keys, {k: java[k] for k in keys}, {k: librdkafka[k] for k in keys})


def landed(bootstrap: str, topic: str, count: int, timeout_s: float = 30) -> list[Delivery]:
    """The ``count`` records written to ``topic`` (read committed), waited for with a
    deadline; and no other within a second after."""
    collector = Collector(bootstrap, topic)
    try:
        deadline = Deadline(timeout_s)
        while len(collector.received) < count and not deadline.passed():
            collector.poll_until(count, 0.5)
        got = collector.received
        assert len(got) == count, f"{len(got)} of {count} records in {topic} after {timeout_s} s"
        assert len(collector.poll_until(count + 1, 1)) == count, f"more than {count} in {topic}"
    finally:
        collector.close()
    return got
