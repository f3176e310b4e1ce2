"""What an App handed off to the retry service, as its readers see it: the requests
topic read from the start with ``read_committed`` (what intake and the Spark
scheduler read), each request by its kind and ``redrive-id``."""

from __future__ import annotations

import uuid
from collections import Counter

from confluent_kafka import Consumer, KafkaError, TopicPartition

from redrive.headers import HeaderError, decode
from redrive.kafka import read_headers


def kind_of(send_to: str, order: str | None) -> str:
    if send_to == "dlq":
        return "dead letter"
    return order if order in ("behind", "release") else "retry"


def committed_hand_offs(bootstrap: str, topic: str) -> Counter[tuple[str, str | None]]:
    """(kind, redrive-id) -> how many times it is on ``topic``, committed."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"hand-offs-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics[topic]
        partitions = [TopicPartition(topic, p, 0) for p in metadata.partitions]
        consumer.assign(partitions)
        open_partitions = {tp.partition for tp in partitions}
        found: Counter[tuple[str, str | None]] = Counter()
        idle = 0
        while open_partitions and idle < 300:
            messages = consumer.consume(500, timeout=0.1)
            idle = idle + 1 if not messages else 0
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        open_partitions.discard(message.partition() or 0)
                    continue
                headers, _ = read_headers(message)
                try:
                    request, _ = decode(headers)
                except HeaderError:
                    found[("unreadable", None)] += 1
                    continue
                found[(kind_of(request.send_to, request.order), request.id)] += 1
        assert not open_partitions, f"{topic}: partitions {open_partitions} not read to the end"
        return found
    finally:
        consumer.close()


def repeated(found: Counter[tuple[str, str | None]]) -> dict[str, int]:
    """Per kind, how many hand-offs are there more than once (or without an id)."""
    twice: Counter[str] = Counter()
    for (kind, request_id), count in found.items():
        if count > 1 or request_id is None:
            twice[kind] += count - 1 if request_id is not None else count
    return dict(twice)
