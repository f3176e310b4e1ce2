"""The exactly-once writer on its own, against the real broker, without Spark.

What a pipeline task does with exactly-once delivery (redrive.spark.exactly_once) is
played here the way Spark plays it: the same source partition's records handed to a
task again (a task retry, a restart from the checkpoint), two attempts of one task at
once (a zombie), the partition's tasks moving between Python workers (each worker is
a `Links` of its own, as each worker process keeps its own producers). A
read_committed reader of the output topic must see each record's output exactly once.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from redrive.spark.exactly_once import (
    WORKER_LINKS,
    Links,
    PartitionWriter,
    TransactionalTarget,
    WrittenElsewhere,
    write_exactly_once,
)
from redrive.spark.output import OutputRecord, to_arrow
from tests.spark import TopicReader, create_topics

pytestmark = pytest.mark.spark

SOURCE = f"eo-orders-{uuid.uuid4().hex[:8]}"
"""The source topic: nothing is read from it, but the progress committed names it."""


@pytest.fixture(scope="module", autouse=True)
def source_topic(bootstrap: str) -> None:
    create_topics(bootstrap, SOURCE, partitions=2)


def source_batch(offsets: range, partition: int = 0) -> pa.RecordBatch:
    """Source records as the pipeline's mapInArrow stage gets them."""
    n = len(offsets)
    values = [f"order-{partition}-{o}".encode() for o in offsets]
    return pa.RecordBatch.from_pydict(
        {
            "topic": [SOURCE] * n,
            "partition": [partition] * n,
            "offset": list(offsets),
            "timestamp_ms": [0] * n,
            "key": values,
            "value": values,
            "headers": [[] for _ in range(n)],
        }
    )


class Handler:
    """Writes each record's value to the output topic, counting the calls."""

    def __init__(self, output: str) -> None:
        self.output = output
        self.calls = 0

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        self.calls += batch.num_rows
        values = batch.column("value").to_pylist()
        return to_arrow([OutputRecord(self.output, v, b"done " + v, []) for v in values])


@pytest.fixture
def target(bootstrap: str) -> TransactionalTarget:
    return TransactionalTarget(f"test-eo-{uuid.uuid4().hex[:8]}", {"bootstrap.servers": bootstrap})


@pytest.fixture
def output(bootstrap: str, new_topic: Callable[..., str]) -> Iterator[tuple[str, TopicReader]]:
    topic = new_topic("eo-out")
    reader = TopicReader(bootstrap, [topic])
    try:
        yield topic, reader
    finally:
        reader.close()


def run_task(
    target: TransactionalTarget, handler: Handler, links: Links, *batches: pa.RecordBatch
) -> dict[str, int]:
    [stats] = list(write_exactly_once(target, handler, links)(batches))
    counts = {name: stats.column(name)[0].as_py() for name in stats.schema.names}
    assert counts["retried"] == counts["dead_lettered"] == 0  # the handler never fails
    return {name: counts[name] for name in ("handled", "skipped", "results")}


def outputs(reader: TopicReader, topic: str, expected: int) -> list[bytes]:
    """The output topic's values once ``expected`` arrived (and a moment for more)."""
    reader.poll(1)
    for _ in range(60):
        if len(reader.of(topic)) >= expected:
            break
        reader.poll(0.5)
    reader.poll(1)  # a repeat would arrive with the rest
    return [m.value or b"" for m in reader.of(topic)]


def test_a_task_run_again_writes_only_what_was_not_committed(
    target: TransactionalTarget, output: tuple[str, TopicReader]
) -> None:
    topic, reader = output
    handler, worker = Handler(topic), Links()
    first = run_task(target, handler, worker, source_batch(range(0, 60)))
    # The same range again, and more (a restarted query's next batch may be larger).
    again = run_task(target, handler, Links(), source_batch(range(0, 100)))
    assert first == {"handled": 60, "skipped": 0, "results": 60}
    assert again == {"handled": 40, "skipped": 60, "results": 40}
    assert handler.calls == 100, "the handler ran again for records already written"
    values = outputs(reader, topic, 100)
    assert sorted(values) == sorted(f"done order-0-{o}".encode() for o in range(100))


def test_of_two_attempts_at_once_only_one_is_visible(
    target: TransactionalTarget, output: tuple[str, TopicReader]
) -> None:
    topic, reader = output
    handler = Handler(topic)
    zombie = PartitionWriter(target, SOURCE, 0, Links())
    zombie.add(handler(source_batch(range(0, 50))), 50)  # open, not committed
    # The task runs again elsewhere: its producer fences the zombie's.
    retried = PartitionWriter(target, SOURCE, 0, Links())
    retried.add(handler(source_batch(range(0, 50))), 50)
    retried.commit()
    with pytest.raises(WrittenElsewhere):
        zombie.commit()
    values = outputs(reader, topic, 50)
    assert sorted(values) == sorted(f"done order-0-{o}".encode() for o in range(50))


def test_a_fenced_attempt_that_commits_first_wins_and_the_other_gives_way(
    target: TransactionalTarget, output: tuple[str, TopicReader]
) -> None:
    topic, reader = output
    handler = Handler(topic)
    first = PartitionWriter(target, SOURCE, 0, Links())
    first.add(handler(source_batch(range(0, 30))), 30)
    second = PartitionWriter(target, SOURCE, 0, Links())  # fences the first
    second.add(handler(source_batch(range(0, 30))), 30)
    first.commit()  # fenced: takes over again (fencing the second), nothing was committed
    with pytest.raises(WrittenElsewhere):
        second.commit()
    values = outputs(reader, topic, 30)
    assert sorted(values) == sorted(f"done order-0-{o}".encode() for o in range(30))


def test_tasks_moving_between_workers_write_each_batch_once(
    target: TransactionalTarget, output: tuple[str, TopicReader]
) -> None:
    topic, reader = output
    handler = Handler(topic)
    workers = [Links(), Links()]
    # Batch after batch, the partition's task lands on one worker or the other; a
    # worker's kept producer was fenced meanwhile by the other's.
    landing = [0, 1, 0, 0, 1, 0, 1, 1]
    for batch, worker in enumerate(landing):
        offsets = range(batch * 25, (batch + 1) * 25)
        stats = run_task(target, handler, workers[worker], source_batch(offsets))
        assert stats == {"handled": 25, "skipped": 0, "results": 25}, batch
    values = outputs(reader, topic, 200)
    assert sorted(values) == sorted(f"done order-0-{o}".encode() for o in range(200))
    assert handler.calls == 200


def test_rows_of_two_source_partitions_in_one_task_are_refused(
    target: TransactionalTarget, output: tuple[str, TopicReader]
) -> None:
    topic, _ = output
    mixed = pa.concat_batches([source_batch(range(0, 5), 0), source_batch(range(0, 5), 1)])
    with pytest.raises(ValueError, match="one source partition per task"):
        run_task(target, Handler(topic), Links(), mixed)


def test_a_shipped_task_function_keeps_the_workers_producer_for_the_next_task(
    target: TransactionalTarget, output: tuple[str, TopicReader]
) -> None:
    """Spark pickles the task function (cloudpickle) and ships it to the executors
    with every batch: each batch's copy must find the Python worker's own producers,
    not bring an empty set of its own, or every task starts a producer (and waits
    for its transactions to be set up) again."""
    topic, reader = output
    handler = Handler(topic)
    key = (target.name, SOURCE, 0)
    for batch in range(3):
        shipped = cloudpickle.loads(cloudpickle.dumps(write_exactly_once(target, handler)))
        offsets = range(batch * 10, (batch + 1) * 10)
        [stats] = list(shipped([source_batch(offsets)]))
        assert stats.column("handled")[0].as_py() == 10
        link = WORKER_LINKS._kept[key]
        if batch == 0:
            first = link
        assert link is first, f"batch {batch} started a producer of its own"
    assert link.reused
    values = outputs(reader, topic, 30)
    assert sorted(values) == sorted(f"done order-0-{o}".encode() for o in range(30))
    WORKER_LINKS._kept.pop(key).close()
