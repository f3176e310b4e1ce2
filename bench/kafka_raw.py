"""Benchmark 1, the limit: produce N messages of 1 KiB and consume them back with
confluent-kafka, tuned (batching, linger, compression off, large fetches)."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, Producer

from bench.common import create_topic

PAYLOAD = b"x" * 1024
PRODUCER_TUNING = {
    "linger.ms": 10,
    "batch.size": 1_000_000,
    "queue.buffering.max.messages": 500_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "acks": "all",
    "enable.idempotence": True,
}
CONSUMER_TUNING = {
    "fetch.min.bytes": 1_048_576,
    "fetch.wait.max.ms": 50,
    "max.partition.fetch.bytes": 8_388_608,
    "queued.min.messages": 200_000,
}


def produce(
    bootstrap: str,
    topic: str,
    n: int,
    headers: list[tuple[str, bytes]] | None = None,
    payload: bytes = PAYLOAD,
) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_TUNING})
    started = time.perf_counter()
    for i in range(n):
        while True:
            try:
                producer.produce(topic, key=str(i % 1000).encode(), value=payload, headers=headers)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(120)
    elapsed = time.perf_counter() - started
    producer.close()
    return elapsed


def consume(bootstrap: str, topic: str, n: int, timeout_s: float = 300) -> float:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **CONSUMER_TUNING,
        }
    )
    consumer.subscribe([topic])
    seen = 0
    started = None
    deadline = time.monotonic() + timeout_s
    while seen < n and time.monotonic() < deadline:
        for msg in consumer.consume(10_000, timeout=0.5):
            if msg.error() is None:
                if started is None:
                    started = time.perf_counter()
                seen += 1
    elapsed = time.perf_counter() - (started or time.perf_counter())
    consumer.close()
    if seen < n:
        raise RuntimeError(f"only {seen} of {n} messages came back")
    return elapsed


def run(bootstrap: str, n: int, rounds: int = 3) -> dict[str, float]:
    """Produce then consume, `rounds` times on fresh topics; the best round counts (the
    limit is what the machine can do, and one round on two shared cores can be half as
    fast as the next). The end-to-end rate is n over both times together."""
    best: dict[str, float] = {}
    for _ in range(rounds):
        topic = create_topic(bootstrap, "bench-raw", 6)
        produce_s = produce(bootstrap, topic, n)
        consume_s = consume(bootstrap, topic, n)
        if not best or produce_s + consume_s < best["produce_s"] + best["consume_s"]:
            best = {"produce_s": produce_s, "consume_s": consume_s}
    return {
        "n": n,
        "rounds": rounds,
        "produce_per_s": n / best["produce_s"],
        "consume_per_s": n / best["consume_s"],
        "end_to_end_per_s": n / (best["produce_s"] + best["consume_s"]),
    }
