"""Benchmark 5: the success path of each strategy against a bare confluent-kafka loop
on the same topic, the same messages and the same handler work, for two workloads:

- `noop`: the handler only takes the value's length: the whole difference is
  redrive's per-record overhead;
- `json`: the handler parses the 1 KiB JSON value, the least a real handler does.

Beside the four strategies with a plain handler, two more rows, both strategy
`service`: `async`, the same work in an `async def` handler that never awaits (what
redrive's event loop, tasks and lanes cost, not I/O), with the App's default
`max_in_flight`; `batch`, a batch handler (`max_records=500, max_wait=0`) doing the
work for each message of its list. The records have keys (`kafka_raw.produce`: 1,000
distinct ones), so the async handler's records go through per-key lanes as in real
use.

The failure paths: against the topics strategy's success path, transactions and 10%
of records failing once (:data:`FAILURE_PATHS`); in rounds of their own, key order
kept in the tiers (:data:`TIER_ORDER_PATHS`) and, through a running retry service,
10% failing once with and without ``ordering="key"`` (:data:`SERVICE_PATHS`; each
round runs a service of its own).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from confluent_kafka import Consumer

from bench.common import create_topic, fresh_database
from bench.kafka_raw import CONSUMER_TUNING, produce
from bench.service import BENCH_KEYS, service_process
from redrive import App, Message, Service, Topics

_DOC: dict[str, Any] = {"id": 1, "items": [{"sku": f"A-{i}", "qty": i} for i in range(30)]}
_DOC["note"] = "x" * (1024 - len(json.dumps({**_DOC, "note": ""})))
PAYLOAD = json.dumps(_DOC).encode()  # valid JSON, exactly 1 KiB
WORK: dict[str, Callable[[bytes], Any]] = {"noop": len, "json": json.loads}

STRATEGIES = ("blocking", "pause", "topics", "service")
VARIANTS = (*STRATEGIES, "service, signed", "async", "batch")
"""The rows: a plain handler with each strategy (and the service's again with
``App(signing=...)``: its success path writes no request, so nothing is signed), then
an async and a batch handler."""
FAILURE_PATHS = (
    "txn",
    "fail 10%",
    "fail 10%, txn",
)
"""Rows against the topics strategy's success path (JSON handler), strategy topics:
the cost of transactions (``transactional=True``) alone, of 10% of records failing
once (handed to the 100 ms tier and handled from there), and of both."""

TIER_ORDER_PATHS = (
    "topics",
    "fail 10%, txn",
    "fail 10%, txn, key order",
)
"""Rows at the success path's size, strategy topics, JSON handler: the success path,
10% failing once with transactions, and the same with ``ordering="key"`` (the later
records of a failed record's key wait behind it: kept by the App while it has room,
:mod:`redrive.consumer.kept_lines`, else in the tier, :mod:`redrive.consumer.key_lines`);
each as a ratio to the first. Every record is in the topic from the start, so every
key is held nearly all the time, and a key goes on once per head's retry read back
from its tier, after the transaction that wrote it commits."""


SERVICE_PATHS = (
    "service",
    "service fail 10%",
    "service fail 10%, signed",
    "service fail 10%, key order",
    "service fail 10%, per-group topic",
    "service fail 10%, source topic, key order",
)
"""Rows through a running retry service, strategy `service`, JSON handler: the success
path, 10% of records failing once (retried through the service, 100 ms), and the same
with ``ordering="key"`` (the later records of a failed record's key wait behind it:
kept by the App while it has room, else in the service); each as a ratio to the first.
The signed row is the second with every request signed by the App and signatures
required by the service. Key order delivers the retries to the group's own topic
(``Service(ordering="key")``'s default, as ``per_group_topic=True`` does for the
unordered row beside it), where the App may pause a partition when it keeps as many
records as it may, until a head's retry comes back; the last row delivers them to the
end of the source partition instead (``per_group_topic=False``). Run at the success
path's size: at a tenth of it, the failure rows measured the last retries' delay more
than a rate."""


class Flaky(Exception):
    pass


def source_offset(message: Message) -> int:
    """The record's offset in its source topic, also when it comes back through a tier
    or the service (where a record waiting behind its key has attempt 1 too)."""
    retry = message.retry
    if retry is not None and retry.original_offset is not None:
        return retry.original_offset
    return message.offset


def fails_once(message: Message) -> bool:
    """Whether the record is one of the tenth that fail once: chosen by a hash of its
    source offset, not by the offset itself. The keys come in turn (``i % 1000``), so
    on a partition holding a multiple of ten keys ``offset % 10`` would pick the same
    keys every time: a tenth of that partition's keys failing on every record, which in
    key order makes each of their records wait for the retry of the one before."""
    offset = source_offset(message)
    return message.attempt == 1 and zlib.crc32(offset.to_bytes(8, "big")) % 10 == 0


def bare_loop(bootstrap: str, topic: str, n: int, work: Callable[[bytes], Any]) -> float:
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
    seen, started = 0, None
    while seen < n:
        for msg in consumer.consume(500, timeout=0.5):
            if msg.error() is None:
                started = started or time.perf_counter()
                work(msg.value() or b"{}")
                seen += 1
        if seen and seen % 50_000 < 500:
            consumer.commit(asynchronous=True)
    elapsed = time.perf_counter() - (started or time.perf_counter())
    consumer.close()
    return elapsed


def app_loop(
    bootstrap: str,
    topic: str,
    n: int,
    variant: str,
    work: Callable[[bytes], Any],
    requests_topic: str | None = None,
) -> float:
    """Seconds from the first record handled to the n-th, through an App: a plain
    handler with strategy `variant`, or (`async`, `batch`) the same work in an async
    or a batch handler, strategy `service`, or one of :data:`FAILURE_PATHS`."""
    failing = "fail" in variant
    ordering: Literal["key"] | None = "key" if "key order" in variant else None
    app = App(
        bootstrap,
        group=uuid.uuid4().hex,
        consumer_kafka=CONSUMER_TUNING,
        transactional="txn" in variant,
        requests_topic=requests_topic,
        signing=BENCH_KEYS if "signed" in variant else None,
    )
    state = {"seen": 0, "started": 0.0}
    done = threading.Event()

    def handler(message: Message) -> None:
        if not state["seen"]:
            state["started"] = time.perf_counter()
        work(message.raw_value or b"{}")
        if failing and fails_once(message):
            raise Flaky("fails once")
        state["seen"] += 1
        if state["seen"] >= n:
            done.set()
            app.stop()

    async def async_handler(message: Message) -> None:
        handler(message)  # no await: the event loop's cost, not I/O

    def batch_handler(batch: list[Message]) -> None:
        if not state["seen"]:
            state["started"] = time.perf_counter()
        for message in batch:
            work(message.raw_value or b"{}")
        state["seen"] += len(batch)
        if state["seen"] >= n:
            done.set()
            app.stop()

    if variant == "async":
        app.add_handler(topic, async_handler, policy="1s", strategy="service")
    elif variant == "batch":
        app.add_batch_handler(
            topic, batch_handler, max_records=500, max_wait=0, policy="1s", strategy="service"
        )
    elif variant in FAILURE_PATHS or variant in TIER_ORDER_PATHS[1:]:
        app.add_handler(topic, handler, policy="100ms", strategy=Topics(ordering=ordering))
    elif variant in SERVICE_PATHS or variant == "service, signed":
        layout = {"per-group topic": True, "source topic": False}
        per_group = next((v for k, v in layout.items() if k in variant), None)
        strategy = Service(ordering=ordering, per_group_topic=per_group)
        app.add_handler(topic, handler, policy="100ms", strategy=strategy)
    else:
        app.add_handler(topic, handler, policy="1s", strategy=variant)  # type: ignore[arg-type]
    thread = threading.Thread(target=lambda: app.run(install_signal_handlers=False), daemon=True)
    thread.start()
    if not done.wait(600):
        app.stop()
        raise RuntimeError(f"{variant}: only {state['seen']} of {n} handled")
    elapsed = time.perf_counter() - state["started"]
    thread.join(60)
    return elapsed


def run(bootstrap: str, n: int, rounds: int = 3) -> dict[str, dict[str, dict[str, float]]]:
    """{workload: {"bare" | variant: {"per_s", "ratio"}}}, all on one topic; the
    failure paths with the JSON handler only, their ratio to the bare loop too (the
    caller divides by the topics row's for their cost against the success path).

    Each of the `rounds` runs the bare loop and every variant in turn, and each keeps
    its best time: on two cores shared with the broker, one run can be a third slower
    than the next for reasons of its own (where the fetches land in the loop).
    """
    topic = create_topic(bootstrap, "bench-consumer", 6)
    produce(bootstrap, topic, n, payload=PAYLOAD)
    results: dict[str, dict[str, dict[str, float]]] = {}
    for name, work in WORK.items():
        best: dict[str, float] = {}
        for _ in range(rounds):
            times = {"bare": bare_loop(bootstrap, topic, n, work)}
            for variant in VARIANTS + (FAILURE_PATHS if name == "json" else ()):
                times[variant] = app_loop(bootstrap, topic, n, variant, work)
            best = {k: min(v, best.get(k, v)) for k, v in times.items()}
        results[name] = {k: {"per_s": n / v, "ratio": best["bare"] / v} for k, v in best.items()}
    return results


def tier_order_paths(bootstrap: str, n: int, rounds: int = 3) -> dict[str, dict[str, float]]:
    """{variant: {"per_s", "ratio"}} of :data:`TIER_ORDER_PATHS`, the ratio to the
    success path's, all on one topic of ``n`` records (each App a group of its own);
    the best time of the rounds is kept."""
    topic = create_topic(bootstrap, "bench-consumer-tier-order", 6)
    produce(bootstrap, topic, n, payload=PAYLOAD)
    best: dict[str, float] = {}
    for _ in range(rounds):
        for variant in TIER_ORDER_PATHS:
            elapsed = app_loop(bootstrap, topic, n, variant, json.loads)
            best[variant] = min(elapsed, best.get(variant, elapsed))
    success = best["topics"]
    return {k: {"per_s": n / v, "ratio": success / v} for k, v in best.items()}


def service_paths(
    bootstrap: str, server_url: str, n: int, workdir: Path, rounds: int = 3
) -> dict[str, dict[str, float]]:
    """{variant: {"per_s", "ratio"}} of :data:`SERVICE_PATHS`, the ratio to the success
    path's. Each variant of each round reads a topic of its own (the service delivers
    retries back to it) through a retry service process of its own on a fresh database;
    the best time of the rounds is kept."""
    best: dict[str, float] = {}
    for _ in range(rounds):
        for variant in SERVICE_PATHS:
            topic = create_topic(bootstrap, "bench-consumer-service", 6)
            produce(bootstrap, topic, n, payload=PAYLOAD)
            name = f"consumer-{len(best)}-{uuid.uuid4().hex[:6]}"
            service, requests_topic = service_process(
                bootstrap,
                fresh_database(server_url),
                topic,
                workdir,
                name,
                signed="signed" in variant,
            )
            with service:
                elapsed = app_loop(bootstrap, topic, n, variant, json.loads, requests_topic)
            best[variant] = min(elapsed, best.get(variant, elapsed))
    success = best["service"]
    return {k: {"per_s": n / v, "ratio": success / v} for k, v in best.items()}
