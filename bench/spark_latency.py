"""Benchmark 6, latency: ONE record through the Spark pipeline, micro-batch against real time.

Each configuration gets fresh topics (one partition) and its own query. Records are
produced one at a time: the next one only after the previous one's output arrived, and
after a random pause of up to one trigger interval, so that records arrive at every
phase of the trigger, not in step with it, and never queue behind each other. A
record's latency is the timestamp of its output record (stamped by Spark's Kafka
producer when it sends it) minus its own (stamped by the producing client), both taken
from the broker; the benchmark's own polling does not count.

Configurations, in one run on one broker:

- the pipeline (`start_pipeline`, a handler returning its value) with a 1 s trigger
  (`start_pipeline`'s default) and with a 100 ms trigger;
- the same query in Spark's real-time mode (`trigger(realTime=...)`, output mode
  `update`). On PySpark 4.2.0 Spark refuses it as the first batch is planned:
  `STREAMING_REAL_TIME_MODE.OPERATOR_OR_SINK_NOT_IN_ALLOWLIST`, the operator
  `MapInArrowExec` (every Python operator is outside real-time mode's allowlist). The
  refusal is recorded, and measured instead should a later Spark accept the query;
- for reference, what real-time mode gives a query without Python: the same topics
  copied by a plain `select("key", "value")` in real-time mode.

p50 and p99 are nearest-rank: with 50 samples the p99 is the slowest one.
"""

from __future__ import annotations

import math
import random
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from bench.common import Result, checkpoint_folder, create_topic

TRIGGERS = ("1 second", "100 milliseconds")
# Real-time mode's trigger duration is its checkpoint interval, not a latency: Spark's
# own default. Records flow through without waiting for it.
REAL_TIME = "5 minutes"
WARMUP = 5
SAMPLES = 50
FIRST_OUTPUT_S = 180.0  # the first record of a query: Python workers start, plans compile
OUTPUT_S = 60.0
ALLOWLIST_ERROR = "STREAMING_REAL_TIME_MODE.OPERATOR_OR_SINK_NOT_IN_ALLOWLIST"

# (source, output, requests, checkpoint) -> a started streaming query
Starter = Callable[[str, str, str, str], Any]


def handler(key: bytes | None, value: bytes | None, headers: Any, attempt: int) -> bytes | None:
    """As little work as possible: the latency measured is the pipeline's own."""
    return value


class QueryFailed(RuntimeError):
    """The query under measurement terminated with an error."""


@dataclass
class Latencies:
    label: str
    ms: list[int]

    def p(self, q: float) -> int:
        ordered = sorted(self.ms)
        return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]

    def line(self) -> str:
        return f"{self.label}: p50 {self.p(50)} ms, p99 {self.p(99)} ms ({len(self.ms)} records)"


class Probe:
    """Produces one record and waits for its output, with the broker's timestamps."""

    def __init__(self, bootstrap: str, source: str, outputs: list[str]) -> None:
        self.source = source
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-latency-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 5,
            }
        )
        # Fresh one-partition topics: read them from their first record, no group join.
        self.consumer.assign([TopicPartition(t, 0, OFFSET_BEGINNING) for t in outputs])

    def send(self, key: bytes) -> int:
        """Produce a record; returns its timestamp as the broker stored it."""
        acks: list[tuple[Any, int]] = []
        self.producer.produce(
            self.source,
            b"{}",
            key,
            on_delivery=lambda err, msg: acks.append((err, msg.timestamp()[1])),
        )
        self.producer.flush(30)
        if not acks or acks[0][0] is not None:
            raise RuntimeError(f"could not produce to {self.source}: {acks}")
        return acks[0][1]

    def output_timestamp(self, key: bytes, query: Any, timeout_s: float) -> int:
        """The timestamp of the output record with this key, once it arrived."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            error = query.exception()
            if error is not None:
                raise QueryFailed(str(error))
            msg = self.consumer.poll(0.05)
            if msg is not None and msg.error() is None and msg.key() == key:
                stamp: int = msg.timestamp()[1]
                return stamp
        raise RuntimeError(f"no output for {key!r} within {timeout_s:.0f} s")

    def close(self) -> None:
        self.consumer.close()


def measure(
    bootstrap: str,
    label: str,
    start: Starter,
    *,
    samples: int,
    pause_s: float,
    rng: random.Random,
) -> Latencies:
    """Latencies of ``samples`` records, one at a time, after ``WARMUP`` of them (one
    in a smoke run: the first record starts the query's Python workers)."""
    source = create_topic(bootstrap, "bench-latency", 1)
    output = create_topic(bootstrap, "bench-latency-out", 1)
    requests = create_topic(bootstrap, "bench-latency-requests", 1)
    probe = Probe(bootstrap, source, [output, requests])
    with checkpoint_folder("redrive-bench-latency-") as checkpoints:
        query = start(source, output, requests, str(checkpoints / "query"))
        try:
            measured: list[int] = []
            warmup = WARMUP if samples >= SAMPLES else 1
            for n in range(warmup + samples):
                key = f"{label}-{n}".encode()
                sent = probe.send(key)
                arrived = probe.output_timestamp(key, query, FIRST_OUTPUT_S if n == 0 else OUTPUT_S)
                if n >= warmup:
                    measured.append(arrived - sent)
                time.sleep(rng.uniform(0.05, 0.05 + pause_s))  # spacing, not waiting
        finally:
            query.stop()
            probe.close()
    return Latencies(label, measured)


def latency(spark: Any, bootstrap: str, *, samples: int = SAMPLES) -> Result:
    from redrive.spark.pipeline import start_pipeline, with_retries

    def micro_batch(trigger: str) -> Starter:
        def start(source: str, output: str, requests: str, checkpoint: str) -> Any:
            return start_pipeline(
                spark,
                bootstrap,
                source,
                handler,
                policy="1s x3",
                output_topic=output,
                group="bench",
                requests_topic=requests,
                checkpoint=checkpoint,
                trigger_interval=trigger,
            )

        return start

    def read(source: str) -> Any:
        return (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .option("includeHeaders", "true")
            .load()
        )

    def real_time(df: Any, checkpoint: str, topic: str | None = None) -> Any:
        writer = df.writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
        if topic is not None:
            writer = writer.option("topic", topic)
        return (
            writer.option("checkpointLocation", checkpoint)
            .outputMode("update")
            .trigger(realTime=REAL_TIME)
            .start()
        )

    def pipeline_in_real_time(source: str, output: str, requests: str, checkpoint: str) -> Any:
        routed = with_retries(
            read(source),
            handler,
            policy="1s x3",
            output_topic=output,
            group="bench",
            requests_topic=requests,
        )
        return real_time(routed, checkpoint)

    def passthrough_in_real_time(source: str, output: str, requests: str, checkpoint: str) -> Any:
        return real_time(read(source).select("key", "value"), checkpoint, topic=output)

    rng = random.Random(6)
    runs = [
        measure(
            bootstrap,
            f"pipeline, trigger {trigger}",
            micro_batch(trigger),
            samples=samples,
            pause_s=seconds(trigger),
            rng=rng,
        )
        for trigger in TRIGGERS
    ]
    for run in runs:
        print(f"spark latency: {run.line()}")
    default, fastest = runs[0], min(runs, key=lambda r: r.p(50))
    figures: dict[str, Any] = {"samples": samples}
    for trigger, run in zip(TRIGGERS, runs, strict=True):
        name = trigger.replace(" ", "").replace("milliseconds", "ms").replace("second", "s")
        figures[f"p50_ms_{name}"], figures[f"p99_ms_{name}"] = run.p(50), run.p(99)
    print(
        f"spark latency: {fastest.label} p50 {fastest.p(50) / default.p(50):.2f}x "
        f"of {default.label}"
    )

    refusal: str | None = None
    rt: Latencies | None = None
    try:
        rt = measure(
            bootstrap,
            "pipeline, real-time mode",
            pipeline_in_real_time,
            samples=samples,
            pause_s=0.1,
            rng=rng,
        )
    except QueryFailed as failed:
        if ALLOWLIST_ERROR not in str(failed):
            raise
        refusal = refused_operators(str(failed))
        print(f"spark latency: pipeline, real-time mode: refused by Spark ({refusal})")
    passthrough = measure(
        bootstrap,
        "passthrough without Python, real-time mode",
        passthrough_in_real_time,
        samples=samples,
        pause_s=0.1,
        rng=rng,
    )
    print(f"spark latency: {passthrough.line()}")
    figures["rt_passthrough_p50_ms"] = passthrough.p(50)
    figures["rt_passthrough_p99_ms"] = passthrough.p(99)
    if rt is None:
        figures["rt_pipeline"] = f"refused: {refusal}"
        ratio = "real time refused (Python stage)"
    else:
        print(f"spark latency: {rt.line()}")
        figures["rt_p50_ms"], figures["rt_p99_ms"] = rt.p(50), rt.p(99)
        factor = rt.p(50) / fastest.p(50)
        print(f"spark latency: real-time p50 {factor:.2f}x of {fastest.label}")
        ratio = f"real time {factor:.2f}x of micro-batch p50"
    return Result("6 spark latency, 1 record", ratio, "-", None, figures)


def seconds(trigger: str) -> float:
    """'1 second' -> 1.0, '100 milliseconds' -> 0.1 (the forms TRIGGERS uses)."""
    amount, unit = trigger.split()
    return float(amount) / (1000 if unit.startswith("milli") else 1)


def refused_operators(message: str) -> str:
    """The operators or sinks named by Spark's real-time allowlist error."""
    match = re.search(r"The (?:operator|sink)\(s\): (.+?) (?:is|are) not in", message)
    names = match.group(1).split(", ") if match else ["?"]
    return ", ".join(name.rpartition(".")[2] for name in names)
