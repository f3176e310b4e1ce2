"""Benchmark 5: the success path of each strategy against a bare confluent-kafka loop
on the same topic (same messages, a handler that touches every value)."""

from __future__ import annotations

import threading
import time
import uuid

from confluent_kafka import Consumer

from bench.common import create_topic
from bench.kafka_raw import CONSUMER_TUNING, produce
from redrive import App, Message

STRATEGIES = ("blocking", "pause", "topics", "service")


def bare_loop(bootstrap: str, topic: str, n: int) -> float:
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
    seen, total, started = 0, 0, None
    while seen < n:
        for msg in consumer.consume(500, timeout=0.5):
            if msg.error() is None:
                started = started or time.perf_counter()
                total += len(msg.value() or b"")
                seen += 1
        if seen and seen % 50_000 < 500:
            consumer.commit(asynchronous=True)
    elapsed = time.perf_counter() - (started or time.perf_counter())
    consumer.close()
    return elapsed


def app_loop(bootstrap: str, topic: str, n: int, strategy: str) -> float:
    app = App(bootstrap, group=uuid.uuid4().hex, kafka=CONSUMER_TUNING)
    state = {"seen": 0, "bytes": 0, "started": 0.0}
    done = threading.Event()

    def handler(message: Message) -> None:
        if not state["seen"]:
            state["started"] = time.perf_counter()
        state["bytes"] += len(message.raw_value or b"")
        state["seen"] += 1
        if state["seen"] >= n:
            done.set()
            app.stop()

    app.add_handler(topic, handler, policy="1s", strategy=strategy)  # type: ignore[arg-type]
    thread = threading.Thread(target=lambda: app.run(install_signal_handlers=False), daemon=True)
    thread.start()
    if not done.wait(600):
        app.stop()
        raise RuntimeError(f"{strategy}: only {state['seen']} of {n} handled")
    elapsed = time.perf_counter() - state["started"]
    thread.join(60)
    return elapsed


def run(bootstrap: str, n: int) -> dict[str, dict[str, float]]:
    topic = create_topic(bootstrap, "bench-consumer", 6)
    produce(bootstrap, topic, n)
    bare = bare_loop(bootstrap, topic, n)
    results = {"bare": {"per_s": n / bare}}
    for strategy in STRATEGIES:
        elapsed = app_loop(bootstrap, topic, n, strategy)
        results[strategy] = {"per_s": n / elapsed, "ratio": bare / elapsed}
    return results
