"""The driver program that tests/spark/test_cluster.py submits to a Spark standalone
cluster with spark-submit: the pipeline and the Spark scheduler in one application,
through redrive.spark's public API, as a user's job would be written.

    spark-submit --master spark://127.0.0.1:7077 --jars <the connector jars> \\
        --conf spark.sql.streaming.stateStore.providerClass=...RocksDBStateStoreProvider \\
        tests/spark/cluster_job.py --bootstrap B --source S --output O \\
        --requests R --dlq D --checkpoints DIR

The session is the plain ``SparkSession.builder.getOrCreate()``: master, jars and
settings all come from spark-submit. It runs until SIGTERM, or until a query fails
more often than its restarts allow.

Records are numbers; the handler fails some of them once (retried) and rejects some
for good (dead letters), and takes a little time per record, so that a worker killed
in the middle of a run kills running tasks.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import signal
import time

from redrive.headers import Header

HANDLE_S = 0.04
"""Time the handler takes per record."""


def is_fatal(n: int) -> bool:
    """Rejected on its first attempt: a dead letter."""
    return n % 25 == 7


def is_flaky(n: int) -> bool:
    """Fails on its first attempt, succeeds on its second (after a 1 s retry)."""
    return n % 10 == 3


def handler(key: bytes | None, value: bytes | None, headers: list[Header], attempt: int) -> bytes:
    n = int(value or b"-1")
    time.sleep(HANDLE_S)
    if is_fatal(n):
        raise ValueError(f"bad record {n}")
    if is_flaky(n) and attempt == 1:
        raise ConnectionError(f"flaky {n}")
    return json.dumps({"n": n, "attempt": attempt}).encode()


def main() -> None:
    parser = argparse.ArgumentParser()
    for option in ("bootstrap", "source", "output", "requests", "dlq", "checkpoints"):
        parser.add_argument(f"--{option}", required=True)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=40)
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1)  # where the driver is, should it hang

    from pyspark.sql import SparkSession

    from redrive.spark import Supervised, build_scheduler_query, run_until_stopped, start_pipeline

    spark = SparkSession.builder.appName("redrive-cluster-test").getOrCreate()
    try:
        scheduler = Supervised(
            lambda: build_scheduler_query(
                spark,
                bootstrap=args.bootstrap,
                requests_topic=args.requests,
                dlq_topic=args.dlq,
                allowed_destinations=[args.source],
                checkpoint=f"{args.checkpoints}/scheduler",
                create_topics=False,
            )
        )
        pipeline = Supervised(
            lambda: start_pipeline(
                spark,
                args.bootstrap,
                args.source,
                handler,
                policy="1s x3",
                fatal_on=ValueError,
                output_topic=args.output,
                group="cluster-test",
                requests_topic=args.requests,
                checkpoint=f"{args.checkpoints}/pipeline",
                trigger_interval="500 milliseconds",
                max_offsets_per_trigger=args.max_offsets_per_trigger,
                query_name="redrive-pipeline",
            )
        )
        print("redrive cluster job: both queries started", flush=True)
        run_until_stopped([pipeline, scheduler])
        print("redrive cluster job: stopped", flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
