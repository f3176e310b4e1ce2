"""Benchmark 7: a bulk replay job keeps its pace (issue 19: 5,000 at 500/s in 10 s ± 20%).

The service runs as its own process on the benchmark's stack; `n` dead letters are
made through its intake, a job replays them through the REST API, and the job is
timed from the API's answer to its `done`, and by the first and last arrival on
the destination. The peer is raw confluent-kafka producing the same records to the
same broker as fast as it can: the ceiling no pace can pass.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, Producer

from bench.common import ServiceProcess, _produce_all, create_topic, fresh_database
from bench.kafka_raw import PRODUCER_TUNING
from bench.service import _http_base
from redrive.client_logs import with_client_logs
from redrive.clock import now_ms
from redrive.headers import RetryHeaders, encode
from redrive.kafka import consume_available
from redrive.service.auth import Tokens
from redrive.service.store import Store

PAYLOAD = b"x" * 512


def _dead_letter_requests(destination: str, n: int) -> list[tuple[bytes, Any]]:
    due = now_ms()
    return [
        (
            f"{i:06d}".encode(),
            encode(
                RetryHeaders(
                    destination=destination,
                    retry_at=due,
                    send_to="dlq",
                    attempt=3,
                    error_type="bench.Replay",
                    reason="attempts exhausted",
                )
            ),
        )
        for i in range(n)
    ]


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, Any]]) -> float:
    """Produce as fast as the client goes; seconds taken."""
    producer = Producer(with_client_logs({"bootstrap.servers": bootstrap, **PRODUCER_TUNING}))
    started = time.perf_counter()
    _produce_all(producer, [(topic, key, PAYLOAD, headers) for key, headers in records])
    return time.perf_counter() - started


def _count(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM redrive_dead_letters").fetchone()
        return int(row[0]) if row else 0


def _call(base: str, path: str, token: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        f"{base}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="GET" if body is None else "POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def run(bootstrap: str, server_url: str, n: int, rate: float, workdir: Path) -> dict[str, Any]:
    destination = create_topic(bootstrap, "bench-replayed", 3)
    requests_topic = create_topic(bootstrap, "bench-replay-requests", 6)
    database_url = fresh_database(server_url)
    records = _dead_letter_requests(destination, n)
    # The peer: the same records, straight to a topic of the same broker.
    raw_s = _produce(bootstrap, create_topic(bootstrap, "bench-replay-raw", 3), records)
    env = {
        "REDRIVE_BOOTSTRAP": bootstrap,
        "REDRIVE_DATABASE_URL": database_url,
        "REDRIVE_REQUESTS_TOPIC": requests_topic,
        "REDRIVE_GROUP_ID": "bench-replay",
        "REDRIVE_ALLOWED_DESTINATIONS": f'["{destination}"]',
    }
    with ServiceProcess(env, workdir / "replay.log") as service:
        base = _http_base(service.log)
        _produce(bootstrap, requests_topic, records)
        deadline = time.monotonic() + 120
        while _count(database_url) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {_count(database_url)} of {n} dead letters were stored")
            time.sleep(0.2)
        store = Store(database_url)
        store.open()
        token = Tokens(store).create("bench", "operator")
        store.close()
        reader = Consumer(
            with_client_logs(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": f"bench-replay-reader-{now_ms()}",
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                }
            )
        )
        reader.subscribe([destination])
        consume_available(reader, 1, 1.0)  # joined before the job starts
        started = time.perf_counter()
        job = _call(
            base,
            "/api/v1/dead-letters/replay",
            token,
            {"filter": {"error_type": "bench.Replay"}, "rate": rate},
        )["job"]
        progress_seen = set()
        arrivals: list[float] = []
        while True:
            for msg in consume_available(reader, 10_000, 0.05):
                if msg.error() is None:
                    arrivals.append(time.perf_counter() - started)
            state = _call(base, f"/api/v1/jobs/{job['id']}", token)
            progress_seen.add(state["settled"])
            if state["state"] != "running":
                break
        job_s = time.perf_counter() - started
        deadline = time.monotonic() + 30
        while len(arrivals) < n and time.monotonic() < deadline:
            for msg in consume_available(reader, 10_000, 0.1):
                if msg.error() is None:
                    arrivals.append(time.perf_counter() - started)
        reader.close()
    if state["sent"] != n or len(arrivals) != n:
        raise RuntimeError(f"job sent {state['sent']}, {len(arrivals)} arrived, of {n}")
    return {
        "n": n,
        "rate": rate,
        "target_s": n / rate,
        "job_s": job_s,
        "first_arrival_s": min(arrivals),
        "last_arrival_s": max(arrivals),
        "achieved_per_s": n / job_s,
        "progress_steps_seen": len(progress_seen),
        "raw_produce_per_s": n / raw_s,
    }
