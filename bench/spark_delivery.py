"""Benchmark 6, delivery: the pipeline writing exactly once against at least once.

Both sides are the same streaming pipeline (`start_pipeline`, the benchmark's handler,
2 source partitions, a 500 ms trigger, at most 10,000 records per micro-batch, as the
scheduler benchmarks run) on the same topic of N records, one in twenty of which fails
once and becomes a retry request: the at-least-once side writes through Spark's Kafka
sink, the exactly-once side in Kafka transactions, one per source partition and
micro-batch (:mod:`redrive.spark.exactly_once`). Each is timed from the query's start
to the commit of the batch that read the N-th record (the sink has written by then),
in alternating rounds after a warm-up, best time of each. Goal: exactly once at
least 0.75x the throughput of at least once.
"""

from __future__ import annotations

import time
from typing import Any

from bench.common import Result, checkpoint_folder, create_topic
from bench.consumer import PAYLOAD
from bench.kafka_raw import produce
from bench.spark_bench import read_from_kafka
from redrive.spark.delivery import AtLeastOnce, Delivery, ExactlyOnce

TRIGGER = "500 milliseconds"
MAX_OFFSETS_PER_TRIGGER = 10_000
ROUNDS = 3


class Declined(Exception):
    """The benchmark's transient failure."""


def handler(key: bytes | None, value: bytes | None, headers: Any, attempt: int) -> bytes:
    """Fails one record in twenty on its first attempt; echoes a short result."""
    if attempt == 1 and key is not None and key.endswith(b"7") and key[-2:-1] in b"02468":
        raise Declined("try again")
    return (value or b"")[:64]


def delivery(spark: Any, bootstrap: str, n: int) -> Result:
    source = create_topic(bootstrap, "bench-delivery", 2)
    produce(bootstrap, source, n, payload=PAYLOAD)
    full = n >= 100_000  # else a smoke run (--quick): one round, no warm-up
    best: dict[str, float] = {}
    for round_ in range(ROUNDS + 1 if full else 1):
        for name, chosen in (("at-least-once", AtLeastOnce()), ("exactly-once", ExactlyOnce())):
            took = time_pipeline(spark, bootstrap, source, n, chosen, f"{name}-{round_}")
            if round_ > 0 or not full:  # a full run's first round: a warm-up
                best[name] = min(best.get(name, took), took)
    alo, eo = best["at-least-once"], best["exactly-once"]
    ratio = alo / eo
    print(f"spark delivery: at-least-once {alo:.2f}s, exactly-once {eo:.2f}s for {n} records")
    return Result(
        "6 spark exactly-once output",
        f"{ratio:.2f}x of at-least-once",
        ">= 0.75x",
        ratio >= 0.75,
        {
            "n": n,
            "at_least_once_per_s": round(n / alo),
            "exactly_once_per_s": round(n / eo),
        },
    )


def time_pipeline(
    spark: Any, bootstrap: str, source: str, n: int, chosen: Delivery, run: str
) -> float:
    """Seconds from the query's start to the commit of the batch that read record n."""
    from redrive.spark.pipeline import start_pipeline

    output = create_topic(bootstrap, "bench-delivery-out", 2)
    requests = create_topic(bootstrap, "bench-delivery-requests", 2)
    with checkpoint_folder("redrive-bench-delivery-") as folder:
        started = time.perf_counter()
        query = start_pipeline(
            spark,
            bootstrap,
            source,
            handler,
            policy="1s x3",
            output_topic=output,
            group=f"bench-{run}",
            checkpoint=str(folder),
            delivery=chosen,
            trigger_interval=TRIGGER,
            max_offsets_per_trigger=MAX_OFFSETS_PER_TRIGGER,
            requests_topic=requests,
        )
        try:
            deadline = time.monotonic() + max(300.0, n / 100)
            while read_from_kafka(query) < n:
                if query.exception() is not None:
                    raise RuntimeError(f"the query failed: {query.exception()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {read_from_kafka(query)} of {n} records read")
                time.sleep(0.05)
            return time.perf_counter() - started
        finally:
            query.stop()
