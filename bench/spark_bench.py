"""Benchmark 6: the pipeline building block against plain PySpark on the same data.

Both read the same Kafka topic as a batch DataFrame (the official connector) and
run the same handler on the executors with `mapInArrow`; the plain one builds its
output directly (no retry routing), redrive's goes through `with_retries` (per-record
failure capture, a `topic` per row). Each is forced with Spark's `noop` sink, best of
three runs after a warm-up. Goal: redrive at most 10% slower.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from bench.common import Result, create_topic
from bench.consumer import PAYLOAD
from bench.kafka_raw import produce


def handler(key: bytes | None, value: bytes | None, headers: Any, attempt: int) -> bytes:
    """A small realistic handler: parse the JSON value, derive a result."""
    order = json.loads(value or b"{}")
    return json.dumps({"id": order.get("id"), "lines": len(order.get("items", []))}).encode()


def plain(batches: Iterable[Any]) -> Iterator[Any]:
    import pyarrow as pa

    for batch in batches:
        keys = batch.column("key").to_pylist()
        values = batch.column("value").to_pylist()
        out = [handler(k, v, None, 1) for k, v in zip(keys, values, strict=True)]
        yield pa.RecordBatch.from_arrays(
            [pa.array(keys, pa.binary()), pa.array(out, pa.binary())], names=["key", "value"]
        )


def run(bootstrap: str, n: int) -> list[Result]:
    from redrive.spark.pipeline import with_retries
    from redrive.spark.session import spark_session

    topic = create_topic(bootstrap, "bench-spark", 2)
    produce(bootstrap, topic, n, payload=PAYLOAD)
    spark = spark_session(f"redrive-bench-{uuid.uuid4().hex[:6]}")
    try:
        source = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .option("includeHeaders", "true")
            .load()
            .cache()
        )
        count = source.count()  # materialise the read once: both sides start from memory
        if count < n:
            raise RuntimeError(f"only {count} of {n} records read")

        def time_plain() -> float:
            started = time.perf_counter()
            source.select("key", "value").mapInArrow(
                plain, "key binary, value binary"
            ).write.format("noop").mode("overwrite").save()
            return time.perf_counter() - started

        def time_redrive() -> float:
            started = time.perf_counter()
            with_retries(
                source, handler, policy="1s x3", output_topic="out", group="bench"
            ).write.format("noop").mode("overwrite").save()
            return time.perf_counter() - started

        time_plain()
        time_redrive()  # warm-up: Python workers, JIT of the plan
        plain_s = min(time_plain() for _ in range(3))
        redrive_s = min(time_redrive() for _ in range(3))
    finally:
        spark.stop()
    ratio = plain_s / redrive_s
    slower = (redrive_s / plain_s - 1) * 100
    print(f"spark pipeline: plain {plain_s:.2f}s, redrive {redrive_s:.2f}s ({slower:+.1f}%)")
    return [
        Result(
            "6 spark pipeline",
            f"{ratio:.2f}x of plain PySpark ({slower:+.0f}%)",
            "<= 10% slower",
            slower <= 10,
            {"n": n, "plain_per_s": round(n / plain_s), "redrive_per_s": round(n / redrive_s)},
        )
    ]
