"""redrive on Spark Structured Streaming (PySpark 4.2, the official Kafka connector).

- :mod:`redrive.spark.session`: a SparkSession with the connector jars and settings
  that suit redrive (:func:`spark_session`).
- :mod:`redrive.spark.pipeline`: run a per-record handler with retries and dead
  letters (:func:`with_retries`, :func:`start_pipeline`), writing exactly once
  (:class:`ExactlyOnce`, the default) or at least once (:class:`AtLeastOnce`).
- :mod:`redrive.spark.scheduler`: the retry service's scheduling as a streaming
  query with ``transformWithStateInPandas`` (:func:`build_scheduler_query`,
  :func:`run_scheduler`).
- :mod:`redrive.spark.supervision`: queries started again from their checkpoints
  after a failure (:class:`Supervised`, :class:`Restarts`), by
  :func:`run_until_stopped`.

Needs the ``spark`` extra (``pip install 'redrive[spark]'``) and Java 17+; see
docs/spark.md.

The names below are imported on first use (PEP 562): the scheduler imports PySpark,
which costs every ``redrive`` command a tenth of a second when the CLI only needs
``redrive spark pipeline``'s options.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redrive.spark.delivery import AtLeastOnce, ExactlyOnce
    from redrive.spark.pipeline import Handler, start_pipeline, with_retries
    from redrive.spark.scheduler import build_scheduler_query
    from redrive.spark.scheduler_run import run_scheduler
    from redrive.spark.session import connector_jars, run_until_stopped, spark_session
    from redrive.spark.supervision import Restarts, Supervised

_HOMES = {
    "AtLeastOnce": "delivery",
    "ExactlyOnce": "delivery",
    "Handler": "pipeline",
    "start_pipeline": "pipeline",
    "with_retries": "pipeline",
    "build_scheduler_query": "scheduler",
    "run_scheduler": "scheduler_run",
    "connector_jars": "session",
    "run_until_stopped": "session",
    "spark_session": "session",
    "Restarts": "supervision",
    "Supervised": "supervision",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "AtLeastOnce",
    "ExactlyOnce",
    "Handler",
    "Restarts",
    "Supervised",
    "build_scheduler_query",
    "connector_jars",
    "run_scheduler",
    "run_until_stopped",
    "spark_session",
    "start_pipeline",
    "with_retries",
]
