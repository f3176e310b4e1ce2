"""The Spark scheduler as a program: a session, the query, and a wait for Ctrl-C or
SIGTERM (what ``redrive spark scheduler`` runs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from redrive.signing import SignatureCheck
from redrive.spark.delivery import EXACTLY_ONCE, Delivery
from redrive.spark.scheduler import build_scheduler_query
from redrive.spark.supervision import Restarts, Supervised
from redrive.topic_names import DLQ_TOPIC, REQUESTS_TOPIC


def run_scheduler(
    *,
    bootstrap: str,
    checkpoint: str,
    requests_topic: str = REQUESTS_TOPIC,
    dlq_topic: str = DLQ_TOPIC,
    allowed_destinations: Sequence[str] = ("*",),
    trigger_interval: str = "500 milliseconds",
    max_delay_days: float = 365.0,
    kafka_options: Mapping[str, str] | None = None,
    admin_config: Mapping[str, str] | None = None,
    master: str | None = "local[2]",
    spark_conf: Mapping[str, str] | None = None,
    metrics_port: int | None = None,
    delivery: Delivery = EXACTLY_ONCE,
    signatures: SignatureCheck | None = None,
    restarts: Restarts | None = None,
) -> None:
    """Run the scheduler until stopped (Ctrl-C, SIGTERM, or the query fails).

    Creates the SparkSession (:func:`redrive.spark.session.spark_session`, ``master``
    and ``spark_conf`` passed on), starts :func:`build_scheduler_query` and blocks;
    with ``metrics_port`` serves its metrics (:mod:`redrive.spark.metrics`).
    On Ctrl-C or SIGTERM the query is stopped cleanly and this returns. A query that
    fails is started again from its checkpoint, as often as ``restarts`` allows
    (:class:`Restarts`' defaults when None); one that fails more often raises its
    exception (``pyspark.errors.StreamingQueryException``).
    """
    from redrive.spark.metrics import SparkMetrics, listen
    from redrive.spark.session import run_until_stopped, spark_session

    spark = spark_session("redrive-spark-scheduler", master=master, conf=spark_conf)
    served = None
    try:
        if metrics_port is not None:
            served = listen(spark, SparkMetrics(), metrics_port)
        query = Supervised(
            lambda: build_scheduler_query(
                spark,
                bootstrap=bootstrap,
                requests_topic=requests_topic,
                dlq_topic=dlq_topic,
                allowed_destinations=allowed_destinations,
                checkpoint=checkpoint,
                trigger_interval=trigger_interval,
                max_delay_days=max_delay_days,
                kafka_options=kafka_options,
                admin_config=admin_config,
                delivery=delivery,
                signatures=signatures,
            ),
            restarts,
        )
        run_until_stopped([query])
    finally:
        if served is not None:
            served.shutdown()
        spark.stop()
