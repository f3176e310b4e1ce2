"""An exactly-once scheduler task without rows asks Kafka nothing
(redrive.spark.exactly_once_batches): an idle scheduler runs a batch every trigger,
and a transaction per task and trigger would be most of its work."""

from __future__ import annotations

import pyarrow as pa
import pytest

from redrive.spark.exactly_once import Links, TransactionalTarget
from redrive.spark.exactly_once_batches import BatchTarget, write_task

pytestmark = pytest.mark.unit


class NoKafka(Links):
    """Links that fail the test if a producer is asked for."""

    def get(self, target: TransactionalTarget, topic: str, partition: int, *, fresh: bool) -> None:  # type: ignore[override]
        raise AssertionError(f"a producer was asked for: {target.name} {topic}[{partition}]")


@pytest.mark.parametrize(
    "rows", [[], [pa.RecordBatch.from_pydict({"n": pa.array([], pa.int64())})]]
)
def test_a_task_without_rows_writes_nothing_and_counts_nothing(rows: list[pa.RecordBatch]) -> None:
    target = BatchTarget("redrive-scheduler.q", "requests", {"bootstrap.servers": "nowhere:1"})
    stats = write_task(target, 0, 7, iter(rows), NoKafka())
    assert stats.num_rows == 1
    assert all(value == 0 for value in stats.to_pylist()[0].values())
