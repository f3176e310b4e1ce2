"""Benchmark 2's peer: the relay through PostgreSQL, the ceiling the retry service is
measured against (the same messages read, stored, taken back out when due and
produced, with nothing else: no validation, no scheduling, no API)."""

from __future__ import annotations

import hashlib
import marshal
import multiprocessing
import time
import uuid
from typing import Any

import psycopg
from confluent_kafka import Consumer, Producer

from bench.common import (
    CpuMeter,
    _produce_all,
    create_topic,
    delete_topics,
    drop_database,
    fresh_database,
    quiet_database,
)
from bench.kafka_raw import CONSUMER_TUNING
from bench.service import RELAY_LINGER_MS, _send_and_read_back
from redrive.clock import now_ms
from redrive.kafka import consume_available
from redrive.service.garbage_collection import settle_after_start_up


def relay_ceiling(
    bootstrap: str, n: int, server_url: str | None = None, *, idempotent: bool = False
) -> dict[str, float]:
    """The ceiling of any retry service on this path and this machine: the Kafka work of
    benchmark 2 alone. A relay process consumes each request and produces it to its
    destination (batched, tuned, acknowledged before its offsets are committed), with
    no classification and no database; the benchmark produces and reads back as in (2).

    With `server_url`, the ceiling of any service that stores its retries in
    PostgreSQL: the relay goes through the database as leanly as it can. One process
    copies each consumed batch into a table with the two indexes any scheduler needs
    (its key and due order) with a binary COPY, commits durably, then commits its
    offsets; another takes
    the due rows out (`DELETE ... RETURNING`, row-locked, `SKIP LOCKED`), produces them
    and commits the delete once the broker acknowledged them. No validation, no
    idempotence, no statistics, headers stored as `marshal` bytes: the least that
    storing a retry costs, on two processes so the two halves overlap.

    ``idempotent``: the ceiling of any service that also drops repeats (a request
    handed off again after a crash, read again before its offsets were committed): in
    the same transaction as each batch, the relay copies each request's identity (16
    bytes: a hash of where it was read) and content (a hash of its value) into a table
    keyed by the identity, and keeps them, as any store that recognises a repeat after
    its retry was delivered must."""
    requests_topic = create_topic(bootstrap, "bench-relay-requests", 6)
    destination = create_topic(bootstrap, "bench-relay-dest", 6)
    context = multiprocessing.get_context("spawn")
    assigned = context.Event()
    database_url = None if server_url is None else fresh_database(server_url)
    if database_url is None:
        workers = [
            context.Process(
                target=_relay, args=(bootstrap, requests_topic, destination, n, assigned)
            )
        ]
    else:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(_RELAY_TABLE)
            conn.execute(_RELAY_IDENTITIES)
        quiet_database(database_url)
        workers = [
            context.Process(
                target=_relay_into_store,
                args=(bootstrap, requests_topic, database_url, n, assigned, idempotent),
            ),
            context.Process(target=_relay_out_of_store, args=(bootstrap, database_url, n)),
        ]
    for worker in workers:
        worker.daemon = True
        worker.start()
    cpu = CpuMeter({worker.pid: "relay" for worker in workers if worker.pid})
    try:
        if not assigned.wait(60):  # in its group before the clock starts, as the service is
            raise RuntimeError("the relay did not join its group")
        done, produced_s, cpu_us = _send_and_read_back(
            bootstrap, requests_topic, destination, n, cpu
        )
    finally:
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.terminate()
    delete_topics(bootstrap, [requests_topic, destination])
    if database_url is not None:
        drop_database(database_url)
    return {
        "n": n,
        "per_s": n / done,
        "seconds": done,
        "produced_s": produced_s,
        "cpu_us_per_msg": cpu_us,  # type: ignore[dict-item]
    }


def _relay_consumer(bootstrap: str, source: str, assigned: Any) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-relay-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **CONSUMER_TUNING,
        }
    )
    consumer.subscribe([source], on_assign=lambda consumer, partitions: assigned.set())
    return consumer


def _relay_producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": RELAY_LINGER_MS,
            "batch.size": 1_000_000,
            "enable.idempotence": True,
        }
    )


def _relay(bootstrap: str, source: str, destination: str, n: int, assigned: Any) -> None:
    settle_after_start_up()  # the service's collector settings: like for like
    consumer = _relay_consumer(bootstrap, source, assigned)
    producer = _relay_producer(bootstrap)
    moved = 0
    while moved < n:
        batch = [m for m in consume_available(consumer, 2000, 0.5) if m.error() is None]
        _produce_all(producer, [(destination, m.key(), m.value(), m.headers()) for m in batch])
        if batch:
            consumer.commit(asynchronous=True)
        moved += len(batch)
    consumer.close()


_RELAY_TABLE = """
CREATE TABLE relay_pending (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    due_ms bigint NOT NULL,
    destination text NOT NULL,
    msg_key bytea,
    msg_value bytea,
    headers bytea NOT NULL
);
CREATE INDEX ON relay_pending (due_ms);
"""
_RELAY_IDENTITIES = """
CREATE TABLE relay_accepted (
    identity bytea PRIMARY KEY,
    keep_from_ms bigint NOT NULL,
    content bytea NOT NULL
);
"""
_RELAY_TAKE_DUE = """
DELETE FROM relay_pending WHERE id IN (
    SELECT id FROM relay_pending WHERE due_ms <= %s ORDER BY due_ms LIMIT 2000
    FOR UPDATE SKIP LOCKED)
RETURNING destination, msg_key, msg_value, headers
"""


def _relay_into_store(
    bootstrap: str, source: str, database_url: str, n: int, assigned: Any, idempotent: bool
) -> None:
    settle_after_start_up()  # the service's collector settings: like for like
    consumer = _relay_consumer(bootstrap, source, assigned)
    stored = 0
    with psycopg.connect(database_url) as conn:
        while stored < n:
            batch = [m for m in consume_available(consumer, 2000, 0.5) if m.error() is None]
            if not batch:
                continue
            with (
                conn.cursor() as cur,
                cur.copy(
                    "COPY relay_pending (due_ms, destination, msg_key, msg_value, headers)"
                    " FROM STDIN (FORMAT BINARY)"
                ) as copy,
            ):
                copy.set_types(["int8", "text", "bytea", "bytea", "bytea"])
                for msg in batch:
                    headers = msg.headers() or []
                    fields: dict[str, Any] = dict(headers)
                    copy.write_row(
                        (
                            int(fields["redrive-retry-at"]),
                            fields["redrive-destination"].decode(),
                            msg.key(),
                            msg.value(),
                            marshal.dumps(headers),
                        )
                    )
            if idempotent:
                _copy_identities(conn, batch)
            conn.commit()  # durable before the offsets move past the batch
            consumer.commit(asynchronous=True)
            stored += len(batch)
    consumer.close()


def _copy_identities(conn: psycopg.Connection[Any], batch: list[Any]) -> None:
    kept_from = now_ms()
    with (
        conn.cursor() as cur,
        cur.copy(
            "COPY relay_accepted (identity, keep_from_ms, content) FROM STDIN (FORMAT BINARY)"
        ) as copy,
    ):
        copy.set_types(["bytea", "int8", "bytea"])
        for msg in batch:
            where = b"%s:%d:%d" % (msg.topic().encode(), msg.partition(), msg.offset())
            identity = hashlib.blake2b(where, digest_size=16).digest()
            content = hashlib.blake2b(msg.value() or b"", digest_size=16).digest()
            copy.write_row((identity, kept_from, content))


def _relay_out_of_store(bootstrap: str, database_url: str, n: int) -> None:
    settle_after_start_up()  # the service's collector settings: like for like
    producer = _relay_producer(bootstrap)
    moved = 0
    # Not waiting for the WAL flush of a delete, as the service's scheduler does not.
    with psycopg.connect(database_url, options="-c synchronous_commit=off") as conn:
        while moved < n:
            rows = conn.execute(_RELAY_TAKE_DUE, (now_ms(),), binary=True).fetchall()
            _produce_all(producer, [(d, k, v, marshal.loads(h)) for d, k, v, h in rows])
            conn.commit()  # the rows are gone once the broker has them
            moved += len(rows)
            if not rows:
                time.sleep(0.005)
