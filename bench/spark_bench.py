"""Benchmark 6: redrive's Spark building blocks against plain PySpark on the same data.

The pipeline: both sides read the same Kafka topic as a batch DataFrame (the official
connector) and run the same handler on the executors with `mapInArrow`; the plain one
builds its output directly (no retry routing), redrive's goes through `with_retries`
(per-record failure capture, a `topic` per row). The handler gets the same inputs on
both sides, as its contract says: `handler(key, value, headers, attempt)`. So the plain
side selects `key, value, headers` and passes each record's headers as a list of
(key, value) pairs (`[]` when null, as for every record of this topic), the least a
plain job calling this handler must do; its output stays `key, value`.

PySpark 4.0 sends a null Arrow list column to Python in time quadratic in the batch
length (about 1.3 s of this run); `with_retries` turns null headers into empty arrays,
which cost nothing. The peer the goal is judged against does the same (`coalesce`), so
the ratio is redrive's own cost; the plain job shipping headers as the connector gives
them is measured too, for context. Each is forced with Spark's `noop` sink; five
interleaved rounds after a warm-up (one round, no warm-up in a smoke run), best time of
each. Goal: redrive at most 10% slower.

The Spark scheduler: N retry requests, all due at once (1 KiB values, the header
contract's `encode`), wait in a requests topic; the scheduler query starts and runs
until all N are on their destination topic. Due retries per second is N over the time
from the query's start to the broker timestamp of the last delivery. Its peer is a
plain streaming query copying the same topic to another one (key, value, headers; no
grouping, no state, no Python), started and timed the same way with the same trigger
and batch size. Goal: at least 0.5x of the passthrough.

The scheduler's lateness: requests at 2,000/s for 30 s, each due at random 1-10 s
after it is sent (the load benchmark 3 puts on the service), so that each waits in
state for its bucket's timer; lateness is arrival on the destination minus due time,
printed beside the trigger interval and the batch duration, which bound it. Goal:
never early.
"""

from __future__ import annotations

import json
import random
import statistics
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from bench.common import Result, checkpoint_folder, create_topic
from bench.consumer import PAYLOAD
from bench.kafka_raw import produce
from bench.service import Reader, lateness_figures, produce_paced
from bench.spark_latency import latency
from redrive.clock import now_ms
from redrive.headers import RetryHeaders, encode
from redrive.spark.delivery import AtLeastOnce, Delivery, ExactlyOnce

# The scheduler's own defaults (build_scheduler_query), passed to both queries
# explicitly so that the passthrough peer runs with the same batches and trigger.
TRIGGER = "500 milliseconds"
TRIGGER_MS = 500
MAX_OFFSETS_PER_TRIGGER = 10_000
# The scheduler's lateness is measured as the service's (benchmark 3): requests at
# this rate, each due at random 1-10 s after it is sent.
LATENESS_RATE = 2_000
LATENESS_S = 30
LATENESS_DUE_WITHIN_MS = 10_000
# A smoke run (--quick): a lighter load, each request still waiting in state a second
# or more.
QUICK_LATENESS = (500, 2, 2_000)  # rate, seconds, due within (ms)
# The streaming delivery comparison runs each side four times: fewer records keep it
# to minutes.
DELIVERY_RECORDS = 100_000
# How far back from a partition's end its last record is looked for: past the commit
# markers of the transactions that wrote it.
TAIL = 50


def handler(key: bytes | None, value: bytes | None, headers: Any, attempt: int) -> bytes:
    """A small realistic handler: parse the JSON value, derive a result."""
    order = json.loads(value or b"{}")
    return json.dumps({"id": order.get("id"), "lines": len(order.get("items", []))}).encode()


def plain(batches: Iterable[Any]) -> Iterator[Any]:
    """The same handler in plain PySpark: the least a job must do to call it as its
    contract says, ``handler(key, value, headers, attempt)``, headers included."""
    import pyarrow as pa

    for batch in batches:
        keys = batch.column("key").to_pylist()
        values = batch.column("value").to_pylist()
        headers = batch.column("headers").to_pylist()  # null for a record without any
        out = [
            handler(k, v, [(h["key"], h["value"]) for h in pairs] if pairs else [], 1)
            for k, v, pairs in zip(keys, values, headers, strict=True)
        ]
        yield pa.RecordBatch.from_arrays(
            [pa.array(keys, pa.binary()), pa.array(out, pa.binary())], names=["key", "value"]
        )


def run(bootstrap: str, n: int) -> list[Result]:
    from redrive.spark.console import quiet_console
    from redrive.spark.session import silence_logs, spark_session, stop_with_jvm

    full = n >= 100_000  # else a smoke run (--quick): a few samples, a few seconds
    # A smoke run measures the default delivery's lateness only, under a lighter load.
    lateness = (LATENESS_RATE, LATENESS_S, LATENESS_DUE_WITHIN_MS) if full else QUICK_LATENESS
    with quiet_console():
        # The benchmark overloads its queries on purpose, stops them mid-batch and asks
        # for a mode Spark refuses: Spark's log of each is expected, and says nothing
        # the figures do not (a query that fails raises here all the same).
        spark = spark_session(f"redrive-bench-{uuid.uuid4().hex[:6]}")
        silence_logs()
        try:
            return _measure(spark, bootstrap, n, full, lateness)
        finally:
            stop_with_jvm(spark)  # before the benchmark's broker stops


def _measure(
    spark: Any, bootstrap: str, n: int, full: bool, lateness: tuple[int, int, int]
) -> list[Result]:
    from bench.spark_delivery import delivery

    return [
        pipeline(spark, bootstrap, n, rounds=5 if full else 1, warm_up=full),
        delivery(spark, bootstrap, min(n, DELIVERY_RECORDS)),
        latency(spark, bootstrap, samples=50 if full else 5),
        *scheduler(spark, bootstrap, n),
        *(
            scheduler_lateness(spark, bootstrap, *lateness, delivery)
            for delivery in ((ExactlyOnce(), AtLeastOnce()) if full else (ExactlyOnce(),))
        ),
    ]


def pipeline(spark: Any, bootstrap: str, n: int, rounds: int, warm_up: bool = True) -> Result:
    from redrive.spark.pipeline import with_retries

    topic = create_topic(bootstrap, "bench-spark", 2)
    produce(bootstrap, topic, n, payload=PAYLOAD)
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
    try:
        count = source.count()  # materialise the read once: both sides start from memory
        if count < n:
            raise RuntimeError(f"only {count} of {n} records read")

        def time_plain(tuned: bool) -> float:
            from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

            headers = F.col("headers")
            if tuned:  # empty arrays, not nulls, as with_retries sends them
                headers = F.coalesce(headers, F.array().cast(source.schema["headers"].dataType))
            started = time.perf_counter()
            source.select("key", "value", headers.alias("headers")).mapInArrow(
                plain, "key binary, value binary"
            ).write.format("noop").mode("overwrite").save()
            return time.perf_counter() - started

        def time_redrive() -> float:
            started = time.perf_counter()
            with_retries(
                source, handler, policy="1s x3", output_topic="out", group="bench"
            ).write.format("noop").mode("overwrite").save()
            return time.perf_counter() - started

        if warm_up:  # Python workers, JIT of the plan
            time_plain(True)
            time_redrive()
        timed = [(time_plain(True), time_plain(False), time_redrive()) for _ in range(rounds)]
        plain_s, as_is_s, redrive_s = (min(times) for times in zip(*timed, strict=True))
    finally:
        source.unpersist()  # free the executor memory before the streaming part
    ratio = plain_s / redrive_s
    slower = (redrive_s / plain_s - 1) * 100
    print(
        f"spark pipeline: plain {plain_s:.2f}s (headers as-is: {as_is_s:.2f}s), "
        f"redrive {redrive_s:.2f}s ({slower:+.1f}%)"
    )
    return Result(
        "6 spark pipeline",
        f"{ratio:.2f}x of plain PySpark ({slower:+.0f}%)",
        "<= 10% slower",
        slower <= 10,
        {
            "n": n,
            "plain_per_s": round(n / plain_s),
            "redrive_per_s": round(n / redrive_s),
            "plain_headers_as_is_per_s": round(n / as_is_s),
        },
    )


class TopicWatch:
    """Counts a topic's records from its end offsets (cheap to poll while Spark runs,
    unlike reading N records back on the same 2 cores), and reads the last record of
    each partition for the broker timestamp of the last write."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-watch-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
            }
        )
        metadata = self.consumer.list_topics(topic, timeout=30)
        self.partitions = sorted(metadata.topics[topic].partitions)

    def ends(self) -> dict[int, int]:
        return {
            p: self.consumer.get_watermark_offsets(
                TopicPartition(self.topic, p), timeout=10, cached=False
            )[1]
            for p in self.partitions
        }

    def count(self) -> int:
        return sum(self.ends().values())  # fresh topics: every low watermark is 0

    def last_timestamp_ms(self) -> int:
        """The broker timestamp of the topic's last record. A transactional writer's
        partitions end with commit markers, which are offsets but not records: each
        partition's tail is read, not just its last offset."""
        ends = {p: end for p, end in self.ends().items() if end}
        self.consumer.assign(
            [TopicPartition(self.topic, p, max(end - TAIL, 0)) for p, end in ends.items()]
        )
        latest: dict[int, int] = {}
        deadline = time.monotonic() + 30
        quiet_since = time.monotonic()
        # Until every partition gave a record and nothing more came for a second.
        while time.monotonic() < deadline:
            msg = self.consumer.poll(0.2)
            if msg is None or msg.error() is not None or msg.partition() is None:
                if set(latest) == set(ends) and time.monotonic() - quiet_since > 1:
                    break
                continue
            quiet_since = time.monotonic()
            partition = int(msg.partition() or 0)
            latest[partition] = max(latest.get(partition, 0), msg.timestamp()[1])
        self.consumer.unassign()
        if set(latest) != set(ends):
            raise RuntimeError(f"could not read the last records of {self.topic}")
        return max(latest.values())

    def close(self) -> None:
        self.consumer.close()


def read_from_kafka(query: Any) -> int:
    """Records the query's committed batches read from Kafka (the scheduler also reads
    one tick row per batch from another source)."""
    return sum(
        source["numInputRows"]
        for progress in query.recentProgress
        for source in progress["sources"]
        if "Kafka" in source["description"]
    )


def time_query(start: Callable[[], Any], watch: TopicWatch, n: int) -> float:
    """Seconds from starting the query to the broker timestamp of the n-th record on the
    watched topic. Spark's Kafka producer stamps each record when it sends it, so this
    does not depend on how often the end offsets are polled."""
    started_ms = now_ms()
    query = start()
    try:
        deadline = time.monotonic() + max(300.0, n / 100)
        while watch.count() < n:
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {watch.count()} of {n} records in {watch.topic}")
            time.sleep(0.2)
        # The records are on the topic before their batch commits (state, offsets):
        # stopping now would abort that batch and log a failed state commit.
        # (Bounded: recentProgress keeps only the last 100 batches.)
        committed = time.monotonic() + 60
        while read_from_kafka(query) < n and time.monotonic() < committed:
            time.sleep(0.2)
        # The scheduler runs a batch every trigger (its tick), mostly back to back on
        # 2 cores: try briefly to stop between two, else interrupt an idle one.
        settle = time.monotonic() + 3
        while query.status["isTriggerActive"] and time.monotonic() < settle:
            time.sleep(0.02)
    finally:
        query.stop()
    return (watch.last_timestamp_ms() - started_ms) / 1000


def start_bench_scheduler(
    spark: Any,
    bootstrap: str,
    requests: str,
    dlq: str,
    destination: str,
    checkpoint: str,
    delivery: Delivery,
) -> Any:
    """The scheduler query as both scheduler benchmarks run it: its default trigger and
    batch size, passed explicitly because the passthrough peer uses them too."""
    from redrive.spark.scheduler import build_scheduler_query

    return build_scheduler_query(
        spark,
        bootstrap=bootstrap,
        requests_topic=requests,
        dlq_topic=dlq,
        allowed_destinations=[destination],
        checkpoint=checkpoint,
        trigger_interval=TRIGGER,
        max_offsets_per_trigger=MAX_OFFSETS_PER_TRIGGER,
        create_topics=False,
        query_name=None,
        delivery=delivery,
    )


@dataclass(frozen=True)
class DueRequests:
    """A requests topic holding n retry requests all due at once, for one destination
    (each scheduler run needs its own: the destination is in the requests)."""

    requests: str
    destination: str
    dlq: str

    @classmethod
    def produced(cls, bootstrap: str, n: int, label: str) -> DueRequests:
        # 6 partitions, as `redrive serve` creates the requests topic.
        made = cls(
            create_topic(bootstrap, f"bench-spark-requests-{label}", 6),
            create_topic(bootstrap, f"bench-spark-dest-{label}", 2),
            create_topic(bootstrap, f"bench-spark-dlq-{label}", 1),
        )
        request = RetryHeaders(destination=made.destination, retry_at=now_ms())
        headers = [(k, v) for k, v in encode(request) if v is not None]  # none are None
        produce(bootstrap, made.requests, n, headers=headers, payload=PAYLOAD)
        return made


def scheduler(spark: Any, bootstrap: str, n: int) -> list[Result]:
    """The scheduler's throughput, at least once against the passthrough and exactly
    once against at least once; all requests due when written, so each is delivered
    in the batch that reads it: this measures the scheduler's intake and delivery
    path (checks, per-group Python, the writes), not waiting for timers."""
    runs = {name: DueRequests.produced(bootstrap, n, name) for name in ("alo", "eo")}
    copy = create_topic(bootstrap, "bench-spark-copy", 2)

    def start_copy(checkpoint: str) -> Any:
        return (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", runs["alo"].requests)
            .option("startingOffsets", "earliest")
            .option("includeHeaders", "true")
            .option("maxOffsetsPerTrigger", str(MAX_OFFSETS_PER_TRIGGER))
            .load()
            .select("key", "value", "headers")
            .writeStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", copy)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=TRIGGER)
            .start()
        )

    def start_scheduler(run: DueRequests, delivery: Delivery, checkpoint: str) -> Any:
        return start_bench_scheduler(
            spark, bootstrap, run.requests, run.dlq, run.destination, checkpoint, delivery
        )

    watches = {
        "copy": TopicWatch(bootstrap, copy),
        **{name: TopicWatch(bootstrap, run.destination) for name, run in runs.items()},
        **{f"{name}-dlq": TopicWatch(bootstrap, run.dlq) for name, run in runs.items()},
    }
    try:
        with checkpoint_folder("redrive-bench-spark-") as folder:
            # The peer first, so that all run on a JVM already warmed by the pipeline.
            copy_s = time_query(lambda: start_copy(str(folder / "copy")), watches["copy"], n)
            alo_s = time_query(
                lambda: start_scheduler(runs["alo"], AtLeastOnce(), str(folder / "alo")),
                watches["alo"],
                n,
            )
            eo_s = time_query(
                lambda: start_scheduler(runs["eo"], ExactlyOnce(), str(folder / "eo")),
                watches["eo"],
                n,
            )
        refused = watches["alo-dlq"].count() + watches["eo-dlq"].count()
    finally:
        for watch in watches.values():
            watch.close()
    if refused:  # every request is valid: a dead letter means the figures are wrong
        raise RuntimeError(f"the scheduler dead-lettered {refused} of {2 * n} requests")
    ratio, eo_ratio = copy_s / alo_s, alo_s / eo_s
    print(
        f"spark scheduler: {n} due retries in {alo_s:.2f}s ({n / alo_s:.0f}/s) at least "
        f"once, {eo_s:.2f}s ({n / eo_s:.0f}/s) exactly once; plain passthrough "
        f"{copy_s:.2f}s ({n / copy_s:.0f}/s)"
    )
    return [
        Result(
            "6 spark scheduler",
            f"{ratio:.2f}x of plain Spark passthrough",
            ">= 0.5x",
            ratio >= 0.5,
            {
                "n": n,
                "due_per_s": round(n / alo_s),
                "scheduler_s": round(alo_s, 1),
                "passthrough_per_s": round(n / copy_s),
                "passthrough_s": round(copy_s, 1),
                "batch": MAX_OFFSETS_PER_TRIGGER,
            },
        ),
        Result(
            "6 spark scheduler exactly-once",
            f"{eo_ratio:.2f}x of at-least-once",
            ">= 0.75x",
            eo_ratio >= 0.75,
            {
                "n": n,
                "exactly_once_per_s": round(n / eo_s),
                "at_least_once_per_s": round(n / alo_s),
            },
        ),
    ]


def scheduler_lateness(
    spark: Any, bootstrap: str, rate: int, seconds: int, due_within_ms: int, delivery: Delivery
) -> Result:
    """The scheduler under a steady load, as benchmark 3 measures the service: `rate`
    requests per second, due at random 1-10 s after sending (1 s to `due_within_ms`),
    so that each waits in state and leaves on its bucket's timer. Lateness is arrival
    on the destination (to a `read_committed` reader: an exactly-once delivery arrives
    when its transaction commits) minus due time. Spark fires timers only when a
    micro-batch starts and writes at its end, so it is judged against two trigger
    intervals plus a batch."""
    label = "eo" if isinstance(delivery, ExactlyOnce) else "alo"
    requests = create_topic(bootstrap, f"bench-spark-late-requests-{label}", 6)
    destination = create_topic(bootstrap, f"bench-spark-late-dest-{label}", 6)
    dlq = create_topic(bootstrap, f"bench-spark-late-dlq-{label}", 1)
    n = rate * seconds
    rng = random.Random(1)
    with checkpoint_folder("redrive-bench-spark-") as checkpoint:
        query = start_bench_scheduler(
            spark, bootstrap, requests, dlq, destination, str(checkpoint), delivery
        )
        try:
            deadline = time.monotonic() + 120
            while not query.recentProgress and time.monotonic() < deadline:
                time.sleep(0.2)  # warm: the first batch starts the Python workers
            reader = Reader(bootstrap, destination, n)
            reader.start()
            reader.ready.wait(30)
            produce_paced(
                bootstrap,
                requests,
                destination,
                rate,
                seconds,
                lambda: rng.randrange(1000, due_within_ms),
            )
            reader.join(120)
            reader.stop.set()
            if query.exception() is not None:
                raise RuntimeError(f"the scheduler query failed: {query.exception()}")
            batches = sorted(p["durationMs"]["triggerExecution"] for p in query.recentProgress)
        finally:
            query.stop()
    figures = lateness_figures(reader.lateness, n)
    # The last batches (recentProgress keeps 100): what a batch costs under this load.
    figures["batch_p50_ms"] = statistics.median(batches)
    figures["batch_p99_ms"] = batches[max(int(len(batches) * 0.99) - 1, 0)]
    figures["batch_max_ms"] = batches[-1]
    bound = 2 * TRIGGER_MS + figures["batch_p50_ms"]
    # What holds on a machine where a batch outlasts the trigger: a timer due just
    # after a batch started waits for the next one (a batch) and leaves at its end.
    figures["bound_ms"] = bound
    figures["batch_bound_ms"] = TRIGGER_MS + 2 * figures["batch_p99_ms"]
    f = figures
    name = "exactly once" if label == "eo" else "at least once"
    print(
        f"spark scheduler lateness, {name}, at {rate}/s, trigger {TRIGGER}: p50 "
        f"{f['p50_ms']:.0f} ms, p99 {f['p99_ms']:.0f} ms, max {f['max_ms']:.0f} ms, early "
        f"{f['early']}; a batch takes {f['batch_p50_ms']:.0f} ms (p50), "
        f"{f['batch_p99_ms']:.0f} ms (p99); 2 triggers + a batch: {bound:.0f} ms"
    )
    return Result(
        "6 spark scheduler lateness" + ("" if label == "eo" else ", at-least-once"),
        f"p99 {f['p99_ms']:.0f} ms late = {f['p99_ms'] / bound:.2f}x of 2 triggers + a batch",
        "<= 1x, never early",
        f["p99_ms"] <= bound and f["early"] == 0,
        {"rate": rate, "trigger": TRIGGER, **figures},
    )
