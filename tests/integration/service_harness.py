"""Helpers for retry-service tests: a fresh database per test, the service in-process
or as a real `redrive serve` process, requests in, deliveries out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from redrive.clock import now_ms
from redrive.deadlines import Deadline
from redrive.headers import Header, RetryHeaders, encode
from redrive.kafka import consume_available
from redrive.service.config import ServiceSettings
from redrive.service.service import RetryService


def fresh_database(server_url: str) -> str:
    """Create an empty database on the test server; returns its URL."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    base, _, _ = server_url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{base}/{name}"


def settings_for(bootstrap: str, database_url: str, **overrides: Any) -> ServiceSettings:
    tag = uuid.uuid4().hex[:8]
    values: dict[str, Any] = {
        "bootstrap": bootstrap,
        "database_url": database_url,
        "requests_topic": f"requests-{tag}",
        "group_id": f"redrive-{tag}",
        "http_port": 0,
    }
    values.update(overrides)
    return ServiceSettings(**values)


@contextmanager
def running_service(settings: ServiceSettings) -> Iterator[RetryService]:
    service = RetryService(settings)
    service.start()
    try:
        yield service
    finally:
        service.stop()


class ChildProcess:
    """A process a test starts and may kill (SIGKILL) or stop (SIGTERM)."""

    proc: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout_s: float = 60) -> int:
        """SIGTERM, wait, SIGKILL if it will not go; its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return int(self.proc.returncode)


class ServiceProcess(ChildProcess):
    """`redrive serve` in its own process, configured through the environment."""

    def __init__(
        self, settings: ServiceSettings, log_path: Path, args: tuple[str, ...] = ()
    ) -> None:
        self.args = args  # `redrive serve` options, over the environment's settings
        self.env = {**os.environ}
        for name, value in settings.model_dump().items():
            if value is None:
                continue
            key = f"REDRIVE_{name.upper()}"
            if isinstance(value, list | dict):
                import json

                self.env[key] = json.dumps(value)
            else:
                self.env[key] = str(value)
        self.env["REDRIVE_LOG_FORMAT"] = "json"
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def launch(self) -> None:
        """Start the process; return at once (`start` waits until it listens)."""
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child writes to it until it ends
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "redrive.cli", "serve", *self.args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def start(self) -> None:
        self.launch()
        assert self.proc is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "redrive serve: listening" in self.log_path.read_text(errors="replace"):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        raise RuntimeError("serve did not start in 60 s")


def store_id(database_url: str) -> str:
    """The identity of the store in this database (made by its first migration)."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT store_id FROM redrive_store").fetchone()
        assert row is not None
        return str(row[0].hex)


def committed_metadata(bootstrap: str, group: str, topic: str) -> dict[int, str | None]:
    """The metadata of each partition's committed offset in `group` (None: none)."""
    client = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        partitions = client.list_topics(topic, timeout=30).topics[topic].partitions
        asked = [TopicPartition(topic, p) for p in partitions]
        return {tp.partition: tp.metadata or None for tp in client.committed(asked, timeout=30)}
    finally:
        client.close()


def request_headers(
    destination: str, retry_at: int, user_headers: list[Header] | None = None, **fields: Any
) -> list[Header]:
    return encode(RetryHeaders(destination=destination, retry_at=retry_at, **fields), user_headers)


def produce(
    bootstrap: str,
    topic: str,
    records: list[dict[str, Any]],
    config: dict[str, Any] | None = None,
) -> None:
    """Produce the records (keyword arguments of Producer.produce) and wait for them;
    `config` adds to the producer's settings (e.g. message.max.bytes)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "enable.idempotence": True,
            **(config or {}),
        }
    )
    for record in records:
        while True:
            try:
                producer.produce(topic, **record)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(60) == 0
    producer.close()


Record = dict[str, Any]


class Load:
    """Produces numbered records at a steady rate from a thread and counts, by value,
    every record the broker acknowledged (`sent`). A record the broker refused is
    produced again, so after `finish` every record made is in `sent`. Survives a broker
    outage: records wait in the producer's queue until the broker is back."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        rate: int,
        make: Callable[[int], Record],
        *,
        name: str = "load",
    ) -> None:
        self.topic = topic
        self.rate = rate
        self.make = make
        self.name = name
        self.config = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 900_000,
            "log_level": 2,  # not every refused connection of an outage
        }
        self.producer = Producer(self.config)
        self.records: dict[bytes, Record] = {}  # made, by value: to send again if stuck
        self.made = 0
        self.sent: set[bytes] = set()
        self.refused = 0
        self._retry: list[Record] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"load-{name}", daemon=True)

    def start(self) -> Load:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def _produce(self, record: Record) -> None:
        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                self.sent.add(record["value"])
            else:
                self.refused += 1
                self._retry.append(record)

        while True:
            try:
                self.producer.produce(self.topic, on_delivery=delivered, **record)
                return
            except BufferError:
                self.producer.poll(0.05)

    def _again(self) -> None:
        retry, self._retry = self._retry, []
        for record in retry:
            self._produce(record)

    def _run(self) -> None:
        while not self._stop.is_set():
            due = int((time.monotonic() - self.started) * self.rate)
            while self.made < due:
                record = self.make(self.made)
                self.records[record["value"]] = record
                self._produce(record)
                self.made += 1
            self._again()
            self.producer.poll(0.05)

    def stop(self) -> None:
        """Stop making records (idempotent; also what a failed test's clean-up calls)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def finish(self, timeout_s: float = 300) -> set[bytes]:
        """Stop producing; return once every record made is acknowledged."""
        self.stop()
        deadline = time.monotonic() + timeout_s
        progress, acknowledged = time.monotonic(), len(self.sent)
        while len(self.sent) < self.made and time.monotonic() < deadline:
            self.producer.flush(1.0)
            self._again()
            if len(self.sent) > acknowledged:
                progress, acknowledged = time.monotonic(), len(self.sent)
            elif time.monotonic() - progress > STUCK_S:
                # This stand-in for an upstream producer, not redrive, is stuck (a
                # librdkafka client after a broker restart on a loaded machine): a new
                # one sends what was never acknowledged (a duplicate at worst).
                self.producer = Producer(self.config)
                for value, record in self.records.items():
                    if value not in self.sent:
                        self._produce(record)
                progress = time.monotonic()
        assert len(self.sent) == self.made, (
            f"{self.name}: {self.made - len(self.sent)} records never acknowledged"
        )
        self.producer.close()
        return self.sent


STUCK_S = 60.0
"""How long a load's producer may go without an acknowledgement before a new one
takes over its records."""


@dataclass
class Delivery:
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    partition: int
    offset: int
    received_ms: int

    def header(self, name: str) -> bytes | None:
        return dict(self.headers).get(name)


@dataclass
class Collector:
    """Reads a topic from the beginning, recording when each message arrived."""

    bootstrap: str
    topic: str
    received: list[Delivery] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"collector-{uuid.uuid4().hex}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 5,
                "fetch.min.bytes": 1,
            }
        )
        self.consumer.subscribe([self.topic])

    def poll_until(self, count: int, timeout_s: float) -> list[Delivery]:
        """Collect until `count` messages in total arrived or the timeout passed."""
        deadline = time.monotonic() + timeout_s
        while len(self.received) < count and time.monotonic() < deadline:
            for msg in consume_available(self.consumer, 1000, 0.05):
                if msg.error() is not None:
                    continue
                self.received.append(
                    Delivery(
                        msg.key(),
                        msg.value(),
                        list(msg.headers() or []),
                        msg.partition(),
                        msg.offset(),
                        now_ms(),
                    )
                )
        return self.received

    def drain(self, quiet_s: float) -> list[Delivery]:
        """Keep collecting until nothing arrived for `quiet_s` seconds."""
        last = len(self.received)
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < quiet_s:
            self.poll_until(len(self.received) + 1, 0.2)
            if len(self.received) != last:
                last = len(self.received)
                quiet_since = time.monotonic()
        return self.received

    def close(self) -> None:
        self.consumer.close()


def dead_letters(database_url: str) -> list[dict[str, Any]]:
    with (
        psycopg.connect(database_url) as conn,
        conn.cursor(row_factory=psycopg.rows.dict_row) as cur,
    ):
        return cur.execute("SELECT * FROM redrive_dead_letters ORDER BY id").fetchall()


def pending_count(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM redrive_pending").fetchone()
        return int(row[0]) if row else 0


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Wait for an outcome with a deadline (a quiet machine's seconds, stretched when
    it is loaded: redrive.deadlines); fail naming what did not happen."""
    deadline = Deadline(timeout_s)
    while not condition():
        if deadline.passed():
            raise AssertionError(f"not within {deadline.describe()}: {what}")
        time.sleep(0.05)


REPLAY_HEADERS = ("redrive-replays", "redrive-replay-of")
"""What the service adds to a replayed record (the loop guard's round and letter)."""


def replay_split(headers: list[Header] | None) -> tuple[list[Header], dict[str, bytes | None]]:
    """A replayed record's headers: the user's, in order, and the replay's own."""
    users = [(n, v) for n, v in headers or [] if n not in REPLAY_HEADERS]
    return users, {n: v for n, v in headers or [] if n in REPLAY_HEADERS}


def first_replay_of(letter_id: int) -> dict[str, bytes | None]:
    """The replay headers of a letter's first replay."""
    return {"redrive-replays": b"1", "redrive-replay-of": str(letter_id).encode()}
