"""Where the Spark scheduler's rows go: exactly once through Kafka transactions, or at
least once through Spark's Kafka sink (:mod:`redrive.spark.delivery`).

Exactly once, each micro-batch goes through ``foreachBatch`` to
:mod:`redrive.spark.exactly_once_batches`: every task writes its rows of the batch in
one transaction that records the batch as written, so a batch run again (a task
retry, a lost executor, a restart from the checkpoint) delivers nothing twice. The
transactions are named after the query's id, which its checkpoint keeps: a query
started on a new checkpoint starts with batch 0 again, and must not take that batch
for one written long ago.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from redrive.spark.delivery import AtLeastOnce, Delivery, ExactlyOnce
from redrive.spark.exactly_once import STATS_SCHEMA
from redrive.spark.exactly_once_batches import BatchTarget, write_batch_once

SCHEDULER_PREFIX: Final = "redrive-scheduler"


class _WriteOnce:
    """The ``foreachBatch`` function: one batch's rows, each task's written once."""

    def __init__(
        self, prefix: str, checkpoint: str, marker_topic: str, client_config: Mapping[str, str]
    ) -> None:
        self.prefix = prefix
        self.checkpoint = checkpoint
        self.marker_topic = marker_topic
        self.client_config = dict(client_config)
        self.target: BatchTarget | None = None

    def __call__(self, batch: Any, batch_id: int) -> None:
        if self.target is None:
            # Written at the query's first start, before its first batch.
            metadata = batch.sparkSession.read.text(f"{self.checkpoint}/metadata").first()
            query_id = json.loads(metadata[0])["id"]
            self.target = BatchTarget(
                f"{self.prefix}.{query_id}", self.marker_topic, self.client_config
            )
        try:
            batch.mapInArrow(write_batch_once(self.target, batch_id), STATS_SCHEMA).collect()
        except Exception as exc:  # noqa: BLE001 - told to Spark briefly, see _brief
            raise _brief(exc, batch_id) from None


# Spark reads whether a foreachBatch function failed because the query was stopped in
# the text of its error, with a pattern that recurses once per character: the full
# text of a Java error (its stack) overflows the thread's stack. The error goes back
# short, worded so that a stop is still read as a stop.
_STOPPED: Final = (
    "py4j.protocol.Py4JJavaError: An error occurred while calling collect.\n"
    ": java.lang.InterruptedException: the query was stopped"
)
_MOST_CHARS: Final = 1000


def _brief(error: Exception, batch_id: int) -> Exception:
    text = str(error)
    if "InterruptedException" in text or "cancelled" in text:
        return RuntimeError(_STOPPED)
    return RuntimeError(f"writing micro-batch {batch_id} failed: {text[:_MOST_CHARS]}")


def scheduler_writer(
    released: Any,
    delivery: Delivery,
    *,
    bootstrap: str,
    checkpoint: str,
    requests_topic: str,
    kafka_options: Mapping[str, str],
    max_message_bytes: int,
) -> Any:
    """The ``DataStreamWriter`` of ``released`` (the scheduler's rows) for ``delivery``;
    the caller sets the checkpoint, trigger and name."""
    if isinstance(delivery, AtLeastOnce):
        return (
            released.writeStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .options(**kafka_options)
            .outputMode("append")
        )
    assert isinstance(delivery, ExactlyOnce)
    client = {
        "bootstrap.servers": bootstrap,
        "message.max.bytes": str(max_message_bytes),
        **delivery.client_config,
    }
    write = _WriteOnce(delivery.name or SCHEDULER_PREFIX, checkpoint, requests_topic, client)
    return released.writeStream.foreachBatch(write).outputMode("append")
