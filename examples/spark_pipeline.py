"""A Spark Structured Streaming pipeline with redrive retries and dead letters.

Reads `orders`, charges each order in a handler on the executors, writes results to
`orders.charged`. A declined payment is retried ("5s x3, 1m x2"); anything else
(a value that is not JSON, say) is a dead letter at once. Run against the local stack:

    redrive local up
    redrive serve &                               # brings retries back, stores dead letters
    python examples/spark_pipeline.py

or, with no retry service, let Spark schedule the retries too (dead letters then go
to the `redrive.dlq` topic, with their reason in `redrive-dead-letter-reason`):

    python examples/spark_pipeline.py --with-scheduler

Then produce to `orders`, e.g. `{"id": 1}`, `{"id": 2, "declined_until_attempt": 2}`
or `not json`, and watch `orders.charged`. Ctrl-C stops; the checkpoint folder
(EXAMPLE_CHECKPOINT, default /tmp/redrive-spark-example) lets it resume where it was.
REDRIVE_BOOTSTRAP overrides the broker, REDRIVE_REQUESTS_TOPIC the requests topic.
EXAMPLE_TOPIC_PREFIX goes before every topic name (`try1.` gives `try1.orders`,
`try1.orders.charged`, `try1.redrive.requests`, `try1.redrive.dlq`), so that runs on
a shared broker keep to their own topics (tests/spark/test_example.py does that).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from redrive.headers import Header
from redrive.local import LocalStack
from redrive.spark import (
    Supervised,
    build_scheduler_query,
    run_until_stopped,
    spark_session,
    start_pipeline,
)


class PaymentDeclined(Exception):
    """Worth retrying: the gateway may accept later."""


def charge(key: bytes | None, value: bytes | None, headers: list[Header], attempt: int) -> bytes:
    """The handler: runs on the executors, once per record (and once per retry)."""
    order = json.loads(value or b"")  # not JSON: JSONDecodeError, not retried (see retry_on)
    if order.get("declined_until_attempt", 0) >= attempt:
        raise PaymentDeclined(f"order {order['id']} declined (attempt {attempt})")
    return json.dumps({"id": order["id"], "charged": True, "attempts": attempt}).encode()


def main() -> None:
    bootstrap = os.environ.get("REDRIVE_BOOTSTRAP") or LocalStack().status().bootstrap
    prefix = os.environ.get("EXAMPLE_TOPIC_PREFIX", "")
    orders, charged = f"{prefix}orders", f"{prefix}orders.charged"
    requests_topic = os.environ.get("REDRIVE_REQUESTS_TOPIC", f"{prefix}redrive.requests")
    dlq_topic = f"{prefix}redrive.dlq"  # with --with-scheduler: where dead letters land
    checkpoint = Path(os.environ.get("EXAMPLE_CHECKPOINT", "/tmp/redrive-spark-example"))  # noqa: S108
    with_scheduler = "--with-scheduler" in sys.argv[1:]

    # Kafka sinks do not create topics: the pipeline's source, output and requests topic
    # must exist before its first batch. The DLQ topic is the scheduler's (or the retry
    # service's): build_scheduler_query creates it, and the requests topic, if missing.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wanted = [NewTopic(orders, 3), NewTopic(charged, 3), NewTopic(requests_topic, 6)]
    for future in admin.create_topics(wanted).values():
        with contextlib.suppress(KafkaException):  # it may exist already
            future.result(30)

    spark = spark_session("redrive-spark-example")  # local[2], Kafka connector jars
    # Supervised: a query that fails (a broker out of reach, a Python worker slow to
    # start) is started again from its checkpoint, up to 3 times in 10 minutes.
    pipeline = Supervised(
        lambda: start_pipeline(
            spark,
            bootstrap,
            [orders],
            charge,
            policy="5s x3, 1m x2",  # 5s, 5s, 5s, 1m, 1m: six attempts in all
            retry_on=[PaymentDeclined],  # anything else is fatal: to the dead letters
            output_topic=charged,
            group="billing",
            requests_topic=requests_topic,
            checkpoint=str(checkpoint / "pipeline"),
        )
    )
    queries = [pipeline]
    if with_scheduler:
        scheduler = Supervised(
            lambda: build_scheduler_query(
                spark,
                bootstrap=bootstrap,
                requests_topic=requests_topic,
                dlq_topic=dlq_topic,
                allowed_destinations=[orders],  # requests may only send messages back here
                checkpoint=str(checkpoint / "scheduler"),
            )
        )
        queries.append(scheduler)
    print(f"running on {bootstrap}: {orders} -> {charged}; Ctrl-C stops", flush=True)
    try:
        run_until_stopped(queries)  # until Ctrl-C or SIGTERM, or a query fails too often
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
