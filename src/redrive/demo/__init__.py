"""`redrive demo`: the first thing a newcomer runs.

At this stage it brings up the real local stack and shows a message carrying the
redrive header contract going through the broker. The items scenario of seed 000
(an update before its create, retried through the retry service) replaces this
as the service and the consumer library land.
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from redrive.headers import RetryHeaders, decode, encode
from redrive.kafka import headers_of, kafka_headers
from redrive.local import LocalStack


def run(*, oneshot: bool = False) -> int:
    print("redrive demo: starting the local stack (Kafka in KRaft mode, embedded PostgreSQL)")
    status = LocalStack().up()
    topic = f"demo-{uuid.uuid4().hex[:8]}"
    AdminClient({"bootstrap.servers": status.bootstrap}).create_topics(
        [NewTopic(topic, num_partitions=1)]
    )[topic].result(30)
    request = RetryHeaders(
        destination="update-item",
        retry_at=int(time.time() * 1000) + 5_000,
        attempt=1,
        original_topic="update-item",
        original_partition=0,
        original_offset=0,
        original_timestamp=int(time.time() * 1000),
        error_type="demo.ItemNotFound",
        error_message="item 626bd1bd not found",
    )
    producer = Producer({"bootstrap.servers": status.bootstrap})
    producer.produce(
        topic,
        key=b"626bd1bd",
        value=b'{"status": "ACTIVE"}',
        headers=kafka_headers(encode(request, [("trace-id", b"demo")])),
    )
    producer.flush(10)
    consumer = Consumer(
        {"bootstrap.servers": status.bootstrap, "group.id": topic, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    msg = None
    deadline = time.monotonic() + 30
    while msg is None and time.monotonic() < deadline:
        msg = consumer.poll(1)
    consumer.close()
    if msg is None or msg.error():
        print("redrive demo: the message did not come back from the broker")
        return 1
    decoded, user_headers = decode(headers_of(msg))
    print(f"sent and read back a retry request on {topic}:")
    print(f"  key {msg.key()!r}  value {msg.value()!r}")
    print(
        f"  destination {decoded.destination}, attempt {decoded.attempt}, "
        f"error {decoded.error_type}: {decoded.error_message}"
    )
    print(f"  user headers kept: {user_headers}")
    print(f"Kafka at {status.bootstrap}, PostgreSQL at {status.database_url}")
    print("Stop the stack with: redrive local down")
    return 0
