"""redrive on Spark Structured Streaming (PySpark 4.0, the official Kafka connector).

- :mod:`redrive.spark.session`: a SparkSession with the connector jars and settings
  that suit redrive (:func:`spark_session`).
- :mod:`redrive.spark.pipeline`: run a per-record handler with retries and dead
  letters (:func:`with_retries`, :func:`start_pipeline`).
- :mod:`redrive.spark.scheduler`: the retry service's scheduling as a streaming
  query with ``transformWithStateInPandas`` (:func:`build_scheduler_query`,
  :func:`run_scheduler`).

Needs the ``spark`` extra (``pip install 'redrive[spark]'``) and Java 17+; see
docs/spark.md.
"""

from __future__ import annotations

from redrive.spark.pipeline import Handler, start_pipeline, with_retries
from redrive.spark.scheduler import build_scheduler_query, run_scheduler
from redrive.spark.session import connector_jars, run_until_stopped, spark_session

__all__ = [
    "Handler",
    "build_scheduler_query",
    "connector_jars",
    "run_scheduler",
    "run_until_stopped",
    "spark_session",
    "start_pipeline",
    "with_retries",
]
