"""Benchmarks 2-4: the retry service end to end, its precision, and a million pending.

The service runs as its own process (`redrive serve`) on the benchmark's private
stack; requests are produced with confluent-kafka and the destination is read back.
"""

from __future__ import annotations

import base64
import json
import random
import re
import statistics
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Final

import psycopg
from confluent_kafka import Consumer, ConsumerGroupState, Producer
from confluent_kafka.admin import AdminClient

from bench.common import (
    CpuMeter,
    ServiceProcess,
    _produce_all,
    create_topic,
    delete_topics,
    drop_database,
    fresh_database,
    quiet_database,
    quiet_machine,
)
from bench.kafka_raw import CONSUMER_TUNING, PRODUCER_TUNING
from redrive.clock import now_ms
from redrive.headers import RetryHeaders, encode
from redrive.kafka import consume_available
from redrive.service.store import Store
from redrive.service.store.packed_headers import pack_headers
from redrive.signing import KeyRing

PAYLOAD = b"x" * 1024
RELAY_LINGER_MS = 5
"""The relay's producer linger (bench/relay.py), which the service's scheduler is given too."""


def _metric(base: str, name: str) -> float:
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _http_base(log: Path) -> str:
    match = re.search(r"listening on (http://[0-9.:]+)", log.read_text())
    assert match, log.read_text()[-2000:]
    return match.group(1)


class Reader(threading.Thread):
    """Reads a destination topic, recording arrival time minus due time per message."""

    def __init__(
        self, bootstrap: str, topic: str, expected: int, tuning: dict[str, int] | None = None
    ) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": uuid.uuid4().hex,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 5,
                **(tuning or {}),
            }
        )
        self.consumer.subscribe([topic])
        self.expected = expected
        self.lateness: list[int] = []
        self.last_arrival = 0.0
        self.ready = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and len(self.lateness) < self.expected:
            msgs = consume_available(self.consumer, 10_000, 0.05)
            self.ready.set()
            now = now_ms()
            for msg in msgs:
                if msg.error() is None:
                    due = int(dict(msg.headers() or [])["redrive-retry-at"] or 0)
                    self.lateness.append(now - due)
            if msgs:
                self.last_arrival = time.perf_counter()
        self.consumer.close()


def wait_for_group(bootstrap: str, group: str, members: int, timeout_s: float = 60) -> None:
    """Wait until `group` is stable with `members` members, each assigned partitions:
    the clock of a run must not start in the middle of the rebalance that the joining of
    a service's workers makes (the relay, too, is in its group before its clock starts)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        described = admin.describe_consumer_groups([group])[group].result(timeout=10)
        if (
            described.state == ConsumerGroupState.STABLE
            and len(described.members) == members
            and all(m.assignment.topic_partitions for m in described.members)
        ):
            return
        time.sleep(0.1)
    raise RuntimeError(f"group {group} not stable with {members} members in {timeout_s} s")


BENCH_KEY: Final = "bench=" + base64.b64encode(b"redrive benchmark key, 32 bytes!").decode()
"""The signed runs' key: the senders sign with it, the service requires it."""
BENCH_KEYS: Final = KeyRing.from_settings([BENCH_KEY])


def _requests(
    destination: str, n: int, due: list[int], signing: KeyRing | None = None
) -> list[tuple[bytes, list]]:  # type: ignore[type-arg]
    requests = [
        (str(i).encode(), encode(RetryHeaders(destination=destination, retry_at=due[i])))
        for i in range(n)
    ]
    if signing is None:
        return requests
    return [(key, signing.signed(headers, key, PAYLOAD)) for key, headers in requests]


def service_process(
    bootstrap: str,
    database_url: str,
    destination: str,
    workdir: Path,
    name: str,
    *,
    signed: bool = False,
) -> tuple[ServiceProcess, str]:
    """A retry service for a benchmark; ``signed``: it requires every request signed
    with :data:`BENCH_KEY`."""
    requests_topic = create_topic(bootstrap, "bench-requests", 6)
    env = {
        "REDRIVE_BOOTSTRAP": bootstrap,
        "REDRIVE_DATABASE_URL": database_url,
        "REDRIVE_REQUESTS_TOPIC": requests_topic,
        "REDRIVE_GROUP_ID": f"bench-{name}",
        # The topic, and its per-group retry topics (``<group>.<topic>.retry``).
        "REDRIVE_ALLOWED_DESTINATIONS": json.dumps([destination, f"*.{destination}.retry"]),
        "REDRIVE_INTAKE_BATCH_SIZE": "2000",
        "REDRIVE_SCHEDULER_BATCH_SIZE": "2000",
    }
    if signed:
        env["REDRIVE_SIGNING_KEYS"] = json.dumps([BENCH_KEY])
        env["REDRIVE_REQUIRE_SIGNATURES"] = "true"
    return ServiceProcess(env, workdir / f"{name}.log"), requests_topic


def _send_and_read_back(
    bootstrap: str,
    requests_topic: str,
    destination: str,
    n: int,
    cpu: CpuMeter,
    while_waiting: Callable[[], None] = lambda: None,
    signing: KeyRing | None = None,
) -> tuple[float, float, dict[str, float]]:
    """Produce N requests due now, wait until all N are on `destination`; returns
    (seconds until the last arrived, seconds the producing took), from the first send,
    and the CPU per message of each part over that same time."""
    # Read back tuned as the raw benchmark reads (throughput, not latency, is measured).
    reader = Reader(bootstrap, destination, n, CONSUMER_TUNING)
    reader.start()
    reader.ready.wait(30)
    quiet_machine()
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_TUNING})
    # Requests are prepared before the clock starts, as the raw benchmark's payload is.
    requests = [
        (requests_topic, key, PAYLOAD, h)
        for key, h in _requests(destination, n, [now_ms()] * n, signing)
    ]
    cpu.start()
    started = time.perf_counter()
    _produce_all(producer, requests)
    produced_s = time.perf_counter() - started
    while reader.is_alive() and time.perf_counter() - started < 600:
        while_waiting()
        time.sleep(0.05)
    cpu_us = cpu.us_per_message(n)
    reader.join(5)
    if len(reader.lateness) < n:
        raise RuntimeError(f"only {len(reader.lateness)} of {n} arrived")
    return reader.last_arrival - started, produced_s, cpu_us


def end_to_end(
    bootstrap: str,
    server_url: str,
    n: int,
    workdir: Path,
    database_url: str | None = None,
    workers: int = 1,
    signed: bool = False,
) -> dict[str, float]:
    """N requests due immediately: produce -> intake -> PostgreSQL -> scheduler -> read,
    through one `redrive serve` with `workers` workers (whole services as processes) on
    one database (a fresh one unless `database_url` is given). ``signed``: every
    request signed (before the clock starts, as they are all prepared), and the service
    requiring signatures."""
    destination = create_topic(bootstrap, "bench-dest", 6)
    database = database_url or fresh_database(server_url)
    serve, requests_topic = service_process(
        bootstrap, database, destination, workdir, "e2e", signed=signed
    )
    serve.env["REDRIVE_WORKERS"] = str(workers)
    # The Kafka clients tuned as the relays' are (through the service's own settings):
    # the ratio compares what each does per message, not their librdkafka defaults.
    serve.env["REDRIVE_INTAKE_KAFKA"] = json.dumps(CONSUMER_TUNING)
    serve.env["REDRIVE_SCHEDULER_KAFKA"] = json.dumps({"linger.ms": RELAY_LINGER_MS})
    with serve:
        base = _http_base(serve.log)
        assert serve.proc is not None
        wait_for_group(bootstrap, serve.env["REDRIVE_GROUP_ID"], workers)
        quiet_database(database)
        # Its workers are its children: the meter counts their CPU as the service's.
        cpu = CpuMeter({serve.proc.pid: "service"})
        started = time.perf_counter()
        ingested: list[float] = []

        checked = [0.0]

        def watch() -> None:
            # Scraping /metrics costs the service CPU (about 3 ms a scrape with two
            # workers, counted as the service's): twice a second is enough.
            if not ingested and time.perf_counter() - checked[0] >= 0.5:
                checked[0] = time.perf_counter()
                # Worker 0's /metrics counts every worker's.
                if _metric(base, "redrive_requests_scheduled_total") >= n:
                    ingested.append(checked[0] - started)
            serve.sample_rss()

        done, produced_s, cpu_us = _send_and_read_back(
            bootstrap, requests_topic, destination, n, cpu, watch, BENCH_KEYS if signed else None
        )
        serve.sample_rss()  # once more: a run can end before `watch` was first called
    delete_topics(bootstrap, [requests_topic, destination])
    if database_url is None:
        drop_database(database)
    return {
        "n": n,
        "workers": workers,
        "per_s": n / done,
        "seconds": done,
        "produced_s": produced_s,
        "ingested_s": ingested[0] if ingested else done,
        "rss_mb": serve.peak_rss / 2**20,  # worker 0's
        "cpu_us_per_msg": cpu_us,  # type: ignore[dict-item]
    }


def produce_paced(
    bootstrap: str,
    requests_topic: str,
    destination: str,
    rate: int,
    seconds: int,
    delay_ms: Callable[[], int],
    each_second: Callable[[], object] = lambda: None,
) -> None:
    """`rate` retry requests per second for `seconds`, spread evenly over each second,
    each due `delay_ms()` after it is sent; `each_second` is called after each second."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    started = time.perf_counter()
    for second in range(seconds):
        batch_start = now_ms()
        for i in range(rate):
            headers = encode(
                RetryHeaders(destination=destination, retry_at=batch_start + delay_ms())
            )
            producer.produce(
                requests_topic, key=str(i).encode(), value=PAYLOAD[:256], headers=headers
            )
            if i % 200 == 0:
                producer.poll(0)
                # spread the second's requests evenly
                ahead = (second + (i + 1) / rate) - (time.perf_counter() - started)
                if ahead > 0:
                    time.sleep(ahead)
        each_second()
    producer.flush(60)


def precision(
    bootstrap: str,
    server_url: str,
    rate: int,
    seconds: int,
    workdir: Path,
    database_url: str | None = None,
    due_within_ms: int = 10_000,
) -> dict[str, float]:
    """`rate` requests per second for `seconds`, due at random within 1-10 s of sending
    (1 s to `due_within_ms`); lateness = arrival on the destination minus due time."""
    destination = create_topic(bootstrap, "bench-precision", 6)
    n = rate * seconds
    service, requests_topic = service_process(
        bootstrap, database_url or fresh_database(server_url), destination, workdir, "precision"
    )
    rng = random.Random(1)
    with service:
        reader = Reader(bootstrap, destination, n)
        reader.start()
        reader.ready.wait(30)
        produce_paced(
            bootstrap,
            requests_topic,
            destination,
            rate,
            seconds,
            lambda: rng.randrange(1000, due_within_ms),
            each_second=service.sample_rss,
        )
        reader.join(120)
    return {**lateness_figures(reader.lateness, n), "rss_mb": service.peak_rss / 2**20}


def lateness_figures(measured: list[int], n: int) -> dict[str, float]:
    """Percentiles of arrival minus due time (ms), and how many came early."""
    lateness = sorted(measured)
    if len(lateness) < n:
        raise RuntimeError(f"only {len(lateness)} of {n} arrived")
    return {
        "n": n,
        "p50_ms": statistics.median(lateness),
        "p99_ms": lateness[int(len(lateness) * 0.99) - 1],
        "max_ms": lateness[-1],
        "min_ms": lateness[0],
        "early": sum(1 for x in lateness if x < 0),
    }


def fill_pending(database_url: str, destination: str, rows: int) -> float:
    """Insert `rows` pending retries due in a year, as intake would have stored them."""
    Store(database_url).open()  # migrate
    started = time.perf_counter()
    far = now_ms() + 300 * 86_400_000
    with psycopg.connect(database_url) as conn, conn.cursor() as cur:
        with cur.copy(
            "COPY redrive_pending (due_ms, destination, msg_key, msg_value, headers,"
            " attempt, request_topic, request_partition, request_offset)"
            " FROM STDIN"
        ) as copy:
            empty = pack_headers([])
            for i in range(rows):
                copy.write_row(
                    (
                        far + i,
                        destination,
                        str(i).encode(),
                        PAYLOAD,
                        empty,
                        1,
                        "bench-fill",
                        0,
                        i,
                    )
                )
        conn.commit()
    # Vacuumed as autovacuum would have long since done for retries stored so far
    # ahead: otherwise the vacuum of a million fresh rows starts when autovacuum next
    # looks, in the middle of whichever run comes then.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE redrive_pending")
    return time.perf_counter() - started
