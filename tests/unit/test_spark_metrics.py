"""The Spark queries' progress as Prometheus metrics (redrive.spark.metrics), read
from progress reports as Spark writes them, without Spark."""

from __future__ import annotations

import pytest

from redrive.spark.metrics import SparkMetrics

pytestmark = pytest.mark.unit


def value(metrics: SparkMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_pipeline_batch_counts_what_became_of_its_records() -> None:
    metrics = SparkMetrics()
    progress = {
        "id": "0c1d",
        "name": "redrive-pipeline-billing",
        "numInputRows": 120,
        "inputRowsPerSecond": 240.0,
        "processedRowsPerSecond": "NaN",  # Spark's word for a rate it could not measure
        "durationMs": {"triggerExecution": 850, "addBatch": 700},
        "observedMetrics": {
            "redrive": {
                "handled": 100,
                "skipped": 20,
                "results": 90,
                "retried": 8,
                "dead_lettered": 2,
            }
        },
    }
    metrics.record(progress)
    metrics.record(progress)
    query = "redrive-pipeline-billing"
    records = "redrive_spark_records_total"
    assert value(metrics, records, query=query, outcome="read") == 240
    assert value(metrics, records, query=query, outcome="results") == 180
    assert value(metrics, records, query=query, outcome="retried") == 16
    assert value(metrics, records, query=query, outcome="dead_lettered") == 4
    assert value(metrics, records, query=query, outcome="skipped") == 40
    assert value(metrics, "redrive_spark_input_rows_per_second", query=query) == 240
    assert value(metrics, "redrive_spark_processed_rows_per_second", query=query) == 0
    assert value(metrics, "redrive_spark_batch_duration_seconds_count", query=query) == 2
    assert value(metrics, "redrive_spark_batch_duration_seconds_sum", query=query) == 1.7
    assert value(metrics, "redrive_spark_query_up", query=query) == 1


def test_the_scheduler_reports_how_late_its_deliveries_leave() -> None:
    metrics = SparkMetrics()
    query = "redrive-scheduler"
    observed = {"delivered": 4, "dead_lettered": 1, "lateness_ms_sum": 2000, "lateness_ms_max": 900}
    metrics.record({"name": query, "numInputRows": 6, "observedMetrics": {"redrive": observed}})
    idle = {"delivered": 0, "dead_lettered": 0, "lateness_ms_sum": 0, "lateness_ms_max": 0}
    metrics.record({"name": query, "numInputRows": 1, "observedMetrics": {"redrive": idle}})
    assert value(metrics, "redrive_spark_records_total", query=query, outcome="delivered") == 4
    assert value(metrics, "redrive_spark_scheduler_lateness_seconds_total", query=query) == 2
    # A batch that delivered nothing leaves the last lateness as it was.
    assert value(metrics, "redrive_spark_scheduler_lateness_max_seconds", query=query) == 0.9


def test_a_query_that_stops_is_down_and_one_that_fails_counts() -> None:
    metrics = SparkMetrics()
    metrics.started("q")
    assert value(metrics, "redrive_spark_query_up", query="q") == 1
    metrics.stopped("q", failed=False)
    assert value(metrics, "redrive_spark_query_up", query="q") == 0
    assert value(metrics, "redrive_spark_query_failures_total", query="q") is None
    metrics.stopped("q", failed=True)
    assert value(metrics, "redrive_spark_query_failures_total", query="q") == 1


def test_what_was_not_believed_and_forged_is_counted() -> None:
    """The pipeline's records whose redrive headers it did not believe, the scheduler's
    dead letters for an invalid signature (forged repeats among them); a batch without
    rows observes nulls, which count nothing."""
    metrics = SparkMetrics()
    records = "redrive_spark_records_total"
    metrics.record({"name": "p", "observedMetrics": {"redrive": {"handled": 3, "doubted": 2}}})
    metrics.record({"name": "p", "observedMetrics": {"redrive": {"doubted": None}}})
    assert value(metrics, records, query="p", outcome="doubted") == 2
    forged = {"delivered": 0, "dead_lettered": 3, "invalid_signature": 2}
    metrics.record({"name": "s", "observedMetrics": {"redrive": forged}})
    assert value(metrics, records, query="s", outcome="invalid_signature") == 2
