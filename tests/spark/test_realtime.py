"""Spark's real-time mode and the pipeline, on real Spark (local mode) and the real broker.

On PySpark 4.2.0, real-time mode (`trigger(realTime=...)`, Spark 4.1+) refuses the
pipeline's query: the handler's stage, `MapInArrowExec`, is outside the operator
allowlist that real-time mode checks when it plans the first batch, as is every Python
operator (scalar, Arrow and pandas UDFs alike). This module keeps that finding honest
(docs/spark.md, "Real-time mode"): a query without Python runs in real-time mode on
the same broker, so the refusal is about the Python stage, not the setup.

If a PySpark upgrade makes the refusal test fail, real-time mode may have become
possible for the pipeline: measure it with `bench/spark_latency.py` (a record must come
out in milliseconds, not at the end of the real-time batch) before offering it in
`start_pipeline`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.errors import StreamingQueryException

from redrive.headers import Header
from redrive.spark.pipeline import with_retries
from redrive.spark.session import spark_session, stop_with_jvm
from tests.integration.service_harness import produce
from tests.spark import TopicReader, create_topics, unique

pytestmark = pytest.mark.spark

# Spark's Python workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

CHECKPOINT_INTERVAL = "5 seconds"  # the least Spark allows by default (minBatchDuration)


def handler(key: bytes | None, value: bytes | None, headers: list[Header], attempt: int) -> bytes:
    return b"handled " + (value or b"")


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("redrive-test-realtime")
    yield session
    stop_with_jvm(session)


def kafka_source(spark: Any, bootstrap: str, topic: str) -> Any:
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .load()
    )


def start_in_real_time(df: Any, bootstrap: str, checkpoint: str, topic: str | None = None) -> Any:
    writer = df.writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
    if topic is not None:
        writer = writer.option("topic", topic)
    return (
        writer.option("checkpointLocation", checkpoint)
        .outputMode("update")  # the only output mode real-time mode accepts
        .trigger(realTime=CHECKPOINT_INTERVAL)
        .start()
    )


def test_a_query_without_python_runs_in_real_time_mode(
    spark: Any, bootstrap: str, tmp_path: Any
) -> None:
    source, output = unique("rt-source"), unique("rt-copy")
    create_topics(bootstrap, source, output)
    reader = TopicReader(bootstrap, [output])
    query = start_in_real_time(
        kafka_source(spark, bootstrap, source).select("key", "value"),
        bootstrap,
        str(tmp_path / "copy"),
        topic=output,
    )
    try:
        produce(bootstrap, source, [{"key": b"k1", "value": b"v1"}])
        copied = reader.wait_for(1, timeout_s=120)
        assert [(r.key, r.value) for r in copied] == [(b"k1", b"v1")]
        assert query.isActive and query.exception() is None
    finally:
        query.stop()
        reader.close()


def test_real_time_mode_refuses_the_pipelines_python_stage(
    spark: Any, bootstrap: str, tmp_path: Any
) -> None:
    source, output, requests = unique("rt-orders"), unique("rt-out"), unique("rt-requests")
    create_topics(bootstrap, source, output, requests)
    routed = with_retries(
        kafka_source(spark, bootstrap, source),
        handler,
        policy="1s x3",
        output_topic=output,
        group="billing",
        requests_topic=requests,
    )
    query = start_in_real_time(routed, bootstrap, str(tmp_path / "pipeline"))
    try:
        # start() returns; the refusal comes as the first batch is planned.
        with pytest.raises(StreamingQueryException) as refused:
            query.awaitTermination(120)
    finally:
        query.stop()
    message = str(refused.value)
    assert "STREAMING_REAL_TIME_MODE.OPERATOR_OR_SINK_NOT_IN_ALLOWLIST" in message
    assert "org.apache.spark.sql.execution.python.MapInArrowExec" in message
    assert not query.isActive
