"""Spark tests: real Spark in local mode against the real broker of the session fixtures.

Helpers shared by the Spark test modules live here.
"""

from __future__ import annotations

import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from redrive.deadlines import Deadline
from redrive.headers import Header
from redrive.kafka import headers_of
from redrive.local.spark_cluster import LocalSparkCluster


def create_topics(
    bootstrap: str, *names: str, partitions: int = 1, config: dict[str, str] | None = None
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(n, num_partitions=partitions, config=config or {}) for n in names]
    )
    for future in futures.values():
        future.result(timeout=30)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass
class Received:
    """A consumed message, with its broker timestamp and when the test saw it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    timestamp_ms: int
    received_ms: int

    def header(self, name: str) -> bytes | None:
        return dict(self.headers).get(name)


class TopicReader:
    """Reads topics from the beginning and keeps everything it read."""

    def __init__(self, bootstrap: str, topics: Sequence[str]) -> None:
        self.received: list[Received] = []
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": unique("spark-test-reader"),
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        self.consumer.subscribe(list(topics))

    def poll(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for msg in self.consumer.consume(500, timeout=0.05):
                if msg.error() is not None:
                    continue
                self.received.append(
                    Received(
                        msg.topic(),
                        msg.partition(),
                        msg.offset(),
                        msg.key(),
                        msg.value(),
                        headers_of(msg),
                        msg.timestamp()[1],
                        time.time_ns() // 1_000_000,
                    )
                )

    def wait_for(
        self,
        count: int,
        timeout_s: float,
        topic: str | None = None,
        queries: Sequence[Any] = (),
    ) -> list[Received]:
        """Read until ``count`` messages (of ``topic``, or of all) arrived or time is up;
        failed at once if one of the streaming ``queries`` that write them failed."""
        deadline = Deadline(timeout_s)
        while len(self.of(topic)) < count and not deadline.passed():
            for query in queries:
                failure = query.exception()
                assert failure is None, f"a query failed: {failure}"
            self.poll(0.2)
        return self.of(topic)

    def of(self, topic: str | None) -> list[Received]:
        return [r for r in self.received if topic is None or r.topic == topic]

    def close(self) -> None:
        self.consumer.close()


@contextmanager
def running_cluster(folder: Path, workers: int) -> Iterator[LocalSparkCluster]:
    """A standalone master and ``workers`` workers on free ports, as `redrive local up
    --spark` starts them; stopped afterwards, whatever happened."""
    cluster = LocalSparkCluster(folder)
    try:
        cluster.up(master_port=0, ui_port=0, workers=workers, quiet=True)
        yield cluster
    finally:
        cluster.down()


def scrape(port: int) -> str:
    """What a command's /metrics says now ("" while nothing answers)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return ""
