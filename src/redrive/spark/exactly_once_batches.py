"""Exactly-once output of a stateful query: each task's rows of a micro-batch in one
Kafka transaction that records the batch as written.

The Spark scheduler's rows (deliveries and dead letters) come out of a stateful
operator, not straight from a source partition, so they cannot be tied to source
offsets as the pipeline's are (:mod:`redrive.spark.exactly_once`). What ties them is
the micro-batch: Spark runs a batch again (a task retry, a lost executor, a restart
from the checkpoint) with the same input, the same state and the same batch time, so
task ``p`` of batch ``n`` makes the same rows every time. Each task writes them with a
transactional producer of its own (``<name>.<p>``, fencing an earlier attempt) and
commits in the same transaction, as the offset of the consumer group ``<name>.<p>``,
``n + 1``: the batches written. Invariant: task ``p``'s rows of batch ``n`` are
visible to ``read_committed`` readers if and only if that offset is past ``n``; a
re-run finds it so and writes nothing.

The offset is kept on partition 0 of a topic that exists (the broker checks), the
scheduler's requests topic; the group reads no record of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from redrive.spark.exactly_once import (
    WORKER_LINKS,
    Links,
    PartitionWriter,
    TransactionalTarget,
    stats_batch,
    worker_links,
)

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class BatchTarget:
    """Where a query's tasks record the batches they wrote (pickled to executors)."""

    name: str
    marker_topic: str
    client_config: Mapping[str, str]

    def of_task(self, partition: int) -> TransactionalTarget:
        return TransactionalTarget(f"{self.name}.{partition}", self.client_config)


def write_batch_once(
    target: BatchTarget, batch_id: int, links: Links | None = None
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function writing one micro-batch's rows (OUTPUT_SCHEMA):
    each task's in one transaction, unless an earlier run of the task wrote them;
    with ``links``' producers, the worker's unless given."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        producers = worker_links() if links is None else links
        yield write_task(target, partition, batch_id, batches, producers)

    return run


def write_task(
    target: BatchTarget,
    partition: int,
    batch_id: int,
    batches: Iterable[pa.RecordBatch],
    links: Links = WORKER_LINKS,
) -> pa.RecordBatch:
    """Task ``partition``'s rows of batch ``batch_id``, written once; its counts.

    A task without rows asks Kafka nothing: an idle scheduler runs a batch every
    trigger, and a transaction for each of its tasks (a fencing check, the offsets,
    a commit) would be most of its work. Leaving the batch unrecorded keeps the
    invariant: the next task with rows records its own batch, past this one, and a
    re-run of this batch has nothing to write either."""
    rows = [batch for batch in batches if batch.num_rows]
    if not rows:
        return stats_batch({"handled": 0})
    writer = PartitionWriter(target.of_task(partition), target.marker_topic, 0, links)
    if writer.committed > batch_id:  # written by an earlier run of this batch
        return stats_batch({"skipped": sum(batch.num_rows for batch in rows)})
    for batch in rows:
        writer.add(batch, batch_id + 1)
    writer.commit()
    return stats_batch({"handled": sum(batch.num_rows for batch in rows), **writer.written})
