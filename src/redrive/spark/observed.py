"""What each micro-batch of redrive's queries did, counted inside the query.

Spark's ``Dataset.observe`` sums columns of the rows a batch writes and reports them,
under a name, in the batch's progress (``observedMetrics``), at no cost beyond the
sums: no second pass over the data, no action of its own. Every query of redrive
observes under :data:`OBSERVED`; :mod:`redrive.spark.metrics` turns the reports into
Prometheus metrics. The outcomes are told apart by the contract's headers, the way
every reader of redrive's records tells them apart:

- a dead letter carries ``redrive-reason`` (the pipeline's) or
  ``redrive-dead-letter-reason`` (the scheduler's, on its dead-letter topic);
- a retry request carries ``redrive-send-to`` and no reason;
- anything else a pipeline writes is a handler's result.

What no row says is counted where it is known: the pipeline's records whose redrive
headers were not believed (``doubted``) by its executors, written in a row of their own
(:data:`redrive.spark.batches.COUNTED_SCHEMA`) that is counted here and not written.
The scheduler's dead letters for an invalid signature (``invalid_signature``: a refused
signature, or a different request under the identity of one accepted before) are
counted by the reason they carry, as the retry service counts them.
"""

from __future__ import annotations

from typing import Any, Final

from redrive.headers import DEAD_LETTER_REASON, REASON, RETRY_AT, SEND_TO
from redrive.spark.batches import DOUBTED, DOUBTED_COLUMN
from redrive.spark.repeats import header_value

OBSERVED: Final = "redrive"
"""The name of redrive's observed metrics in a query's progress."""

LATE: Final = "redrive_lateness_ms"

INVALID_SIGNATURE_TEXT: Final = "invalid signature"
"""How the reason of a dead letter for an invalid signature starts (redrive.requests)."""


def _has(name: str) -> Any:
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

    return F.exists(F.col("headers"), lambda h: h["key"] == F.lit(name))


def _count(condition: Any, name: str) -> Any:
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

    return F.sum(F.when(condition, 1).otherwise(0)).cast("long").alias(name)


def pipeline_outcomes(routed: Any) -> Any:
    """``routed`` (the pipeline's rows, in COUNTED_SCHEMA), observed: how many rows of
    each batch are results, retry requests and dead letters, and how many records were
    doubted; the rows to write in OUTPUT_SCHEMA."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

    written = F.col("topic").isNotNull()  # not a row of counts
    dead = written & _has(REASON)
    retried = written & ~_has(REASON) & _has(SEND_TO)
    observed = routed.observe(
        OBSERVED,
        _count(written & ~_has(REASON) & ~_has(SEND_TO), "results"),
        _count(retried, "retried"),
        _count(dead, "dead_lettered"),
        F.coalesce(F.sum(DOUBTED_COLUMN), F.lit(0)).cast("long").alias(DOUBTED),
    )
    return observed.where(written).drop(DOUBTED_COLUMN)


def written_outcomes(stats: Any) -> Any:
    """The exactly-once tasks' counts (their STATS_SCHEMA rows), summed per batch."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

    return stats.observe(OBSERVED, *[F.sum(c).cast("long").alias(c) for c in stats.columns])


def scheduler_outcomes(released: Any) -> Any:
    """``released`` (the scheduler's rows, in OUTPUT_SCHEMA), observed: deliveries,
    dead letters, and how late the deliveries leave (the batch's time less their
    ``redrive-retry-at``; they reach the broker a little later still)."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

    dead = _has(DEAD_LETTER_REASON)
    forged = F.exists(
        F.col("headers"),
        lambda h: (
            (h["key"] == F.lit(DEAD_LETTER_REASON))
            & h["value"].cast("string").startswith(INVALID_SIGNATURE_TEXT)
        ),
    )
    due = header_value(RETRY_AT).cast("string").cast("long")
    # A column first: observed metrics take no clock inside their aggregates.
    late = F.when(~dead, F.unix_millis(F.current_timestamp()) - due)
    return (
        released.withColumn(LATE, late)
        .observe(
            OBSERVED,
            _count(~dead, "delivered"),
            _count(dead, "dead_lettered"),
            _count(forged, "invalid_signature"),
            F.coalesce(F.sum(LATE), F.lit(0)).cast("long").alias("lateness_ms_sum"),
            F.coalesce(F.max(LATE), F.lit(0)).cast("long").alias("lateness_ms_max"),
        )
        .drop(LATE)
    )
