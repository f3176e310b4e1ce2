"""Benchmark 5's share-group rows: redrive on a share group (``ShareApp``) against a
bare ``ShareConsumer`` loop with the same JSON handler on the same one-partition
topic, and redrive's throughput with 1, 2 and 4 consumers sharing that partition.

The bare loop is what a careful hand-written share consumer does: explicit
acknowledgement, each record accepted, the acknowledgements sent with the next poll.
Each run is a share group of its own reading the topic from its start. The several
consumers are processes of their own (one Python thread each would share one
interpreter lock): the time is from the first record any of them handled to the n-th.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import threading
import time
import uuid
from typing import Any

from confluent_kafka import AcknowledgeType, ShareConsumer
from confluent_kafka.admin import AdminClient

from bench.common import create_topic
from bench.consumer import PAYLOAD
from bench.kafka_raw import produce
from redrive import Message, ShareApp
from redrive.consumer.share.group_terms import configure_group
from redrive.logs import configure

CONSUMERS = (1, 2, 4)
QUIET = {"log_level": 0}  # the client's "Preview" notice once per consumer: not here


def _new_group(bootstrap: str) -> str:
    group = f"bench-share-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    configure_group(admin, group, {"share.auto.offset.reset": "earliest"})
    return group


def bare_loop(bootstrap: str, topic: str, n: int) -> float:
    consumer = ShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": _new_group(bootstrap),
            "share.acknowledgement.mode": "explicit",
            **QUIET,
        }
    )
    consumer.subscribe([topic])
    seen, started = 0, 0.0
    while seen < n:
        for msg in consumer.poll(0.5):
            if msg.error() is None:
                started = started or time.perf_counter()
                json.loads(msg.value() or b"{}")
                consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
                seen += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


def _redrive_consumer(
    bootstrap: str, topic: str, group: str, n: int, index: int, counts: Any, firsts: Any
) -> None:
    """One ShareApp process: its count and its first record's time in its own slots
    (one writer each, no lock: the bare loop counts in a local variable)."""
    configure("console", level=logging.WARNING)  # as the benchmark's own process
    app = ShareApp(bootstrap, group=group, kafka=QUIET)
    seen = [0]

    def handle(message: Message) -> None:
        json.loads(message.raw_value or b"{}")
        if not seen[0]:
            firsts[index] = time.perf_counter()
        seen[0] += 1
        counts[index] = seen[0]

    app.add_handler(topic, handle, policy="1s")

    def stop_when_done() -> None:  # also when other processes handled the last
        while sum(counts) < n:
            time.sleep(0.02)
        app.stop()

    threading.Thread(target=stop_when_done, daemon=True).start()
    app.run(install_signal_handlers=False)


def redrive_loop(bootstrap: str, topic: str, n: int, consumers: int) -> float:
    """Seconds from the first record handled to the n-th, by ``consumers`` ShareApp
    processes of one group."""
    context = multiprocessing.get_context("spawn")
    counts: Any = context.Array("q", consumers, lock=False)
    firsts: Any = context.Array("d", consumers, lock=False)
    group = _new_group(bootstrap)
    processes = [
        context.Process(
            target=_redrive_consumer, args=(bootstrap, topic, group, n, i, counts, firsts)
        )
        for i in range(consumers)
    ]
    for process in processes:
        process.start()
    deadline = time.monotonic() + 600
    while sum(counts) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"share group: only {sum(counts)} of {n} handled")
        time.sleep(0.005)
    elapsed = time.perf_counter() - min(first for first in firsts if first)
    for process in processes:
        process.join(60)
        if process.is_alive():
            process.kill()
    return elapsed


def run(bootstrap: str, n: int, rounds: int = 3) -> dict[str, float]:
    """{"bare", "redrive 1", "redrive 2", "redrive 4": records per second}, the best
    of ``rounds`` interleaved runs each, on one topic of one partition."""
    topic = create_topic(bootstrap, "bench-share", 1)
    produce(bootstrap, topic, n, payload=PAYLOAD)
    best: dict[str, float] = {}
    for _ in range(rounds):
        times = {"bare": bare_loop(bootstrap, topic, n)}
        for count in CONSUMERS:
            times[f"redrive {count}"] = redrive_loop(bootstrap, topic, n, count)
        best = {k: min(v, best.get(k, v)) for k, v in times.items()}
    return {k: n / v for k, v in best.items()}
