"""The Spark queries' metrics for Prometheus: a streaming query listener's view.

:class:`SparkMetrics` turns each micro-batch's progress (Spark's
``StreamingQueryProgress``, as its JSON) into Prometheus metrics, every one labelled
with the query's name: the records read and what became of them (redrive's observed
counts, :mod:`redrive.spark.observed`), the input and processing rates, the batch
durations, and for the scheduler how late its deliveries leave. A query that stops
sets ``redrive_spark_query_up`` to 0, one that fails also counts a failure: the alert
rules watch both. :func:`listen` registers it with a session as a
``StreamingQueryListener`` and serves ``/metrics`` on a port; :meth:`SparkMetrics.
record` takes a progress as a dict, so the mapping is read and tested without Spark.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from redrive.errors import ConfigError
from redrive.spark.observed import OBSERVED

BATCH_BUCKETS: Final = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, float("inf"))
OUTCOMES: Final = (
    "handled",
    "skipped",
    "results",
    "retried",
    "dead_lettered",
    "delivered",
    "doubted",
    "invalid_signature",
)
"""The observed counts exported as ``redrive_spark_records_total{outcome=...}``."""


class SparkMetrics:
    """The metrics of one session's queries, in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.records = Counter(
            "redrive_spark_records",
            "Records of redrive's Spark queries: read from Kafka (outcome read), and what "
            "became of them: handled, skipped (written by an earlier attempt), results, "
            "retried, dead_lettered, delivered (the scheduler's); doubted (the pipeline's "
            "records whose redrive headers it did not believe) and invalid_signature (the "
            "scheduler's dead letters for a refused signature or a forged repeat).",
            ["query", "outcome"],
            registry=r,
        )
        self.batches = Histogram(
            "redrive_spark_batch_duration_seconds",
            "How long each micro-batch took, from its start to its commit.",
            ["query"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.input_rate = Gauge(
            "redrive_spark_input_rows_per_second",
            "Records per second arriving, over the last micro-batch.",
            ["query"],
            registry=r,
        )
        self.processed_rate = Gauge(
            "redrive_spark_processed_rows_per_second",
            "Records per second processed, over the last micro-batch.",
            ["query"],
            registry=r,
        )
        self.lateness_sum = Counter(
            "redrive_spark_scheduler_lateness_seconds",
            "The Spark scheduler's deliveries: seconds past their redrive-retry-at when "
            "their batch released them, summed (over records_total{outcome=delivered}: "
            "the mean).",
            ["query"],
            registry=r,
        )
        self.lateness_max = Gauge(
            "redrive_spark_scheduler_lateness_max_seconds",
            "The latest delivery of the Spark scheduler's last batch that delivered any.",
            ["query"],
            registry=r,
        )
        self.up = Gauge(
            "redrive_spark_query_up",
            "1 while the query runs, 0 once it stopped (or failed).",
            ["query"],
            registry=r,
        )
        self.failures = Counter(
            "redrive_spark_query_failures",
            "Queries that ended with an error.",
            ["query"],
            registry=r,
        )

    def started(self, query: str) -> None:
        self.up.labels(query).set(1)

    def stopped(self, query: str, *, failed: bool) -> None:
        self.up.labels(query).set(0)
        if failed:
            self.failures.labels(query).inc()

    def record(self, progress: Mapping[str, Any]) -> None:
        """One micro-batch's progress (``StreamingQueryProgress.json``, parsed)."""
        query = str(progress.get("name") or progress.get("id") or "unnamed")
        self.up.labels(query).set(1)
        self.records.labels(query, "read").inc(_number(progress.get("numInputRows")))
        durations = progress.get("durationMs") or {}
        if "triggerExecution" in durations:
            self.batches.labels(query).observe(_number(durations["triggerExecution"]) / 1000)
        self.input_rate.labels(query).set(_number(progress.get("inputRowsPerSecond")))
        self.processed_rate.labels(query).set(_number(progress.get("processedRowsPerSecond")))
        observed = (progress.get("observedMetrics") or {}).get(OBSERVED) or {}
        for outcome in OUTCOMES:
            if outcome in observed:
                self.records.labels(query, outcome).inc(_number(observed[outcome]))
        delivered = _number(observed.get("delivered"))
        if delivered:
            self.lateness_sum.labels(query).inc(max(_number(observed["lateness_ms_sum"]), 0) / 1000)
            self.lateness_max.labels(query).set(_number(observed["lateness_ms_max"]) / 1000)


def _number(value: object) -> float:
    """A progress figure as a number: Spark writes NaN (or nothing) for a rate it
    could not measure, which is 0 here."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return number if number == number else 0.0  # NaN is not equal to itself


def listen(spark: Any, metrics: SparkMetrics, port: int, host: str = "0.0.0.0") -> Any:  # noqa: S104 - a metrics endpoint is scraped from elsewhere
    """Register ``metrics`` with the session's queries and serve ``/metrics`` on
    ``port``; returns the server (``shutdown()`` stops it). A port in use is a
    ConfigError naming ``--metrics-port``."""
    from prometheus_client import start_http_server
    from pyspark.sql.streaming.listener import StreamingQueryListener

    names: dict[str, str] = {}  # a query's end names only its id

    class Listener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's names
            names[str(event.id)] = str(event.name or event.id)
            metrics.started(names[str(event.id)])

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            metrics.record(json.loads(event.progress.json))

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            name = names.get(str(event.id), str(event.id))
            metrics.stopped(name, failed=event.exception is not None)

    try:
        server, _ = start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as exc:
        raise ConfigError(
            "--metrics-port",
            f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}",
            "choose a free port, or 0 for any",
        ) from None
    spark.streams.addListener(Listener())
    return server
