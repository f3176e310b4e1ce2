"""Exactly-once output: a task's outputs in Kafka transactions that say how far they go.

A pipeline task handles one Kafka source partition's offsets of one micro-batch (the
Kafka source makes one task per partition). With :class:`redrive.spark.delivery.
ExactlyOnce` the task writes its outputs itself, with a transactional producer whose
``transactional.id`` is the pipeline's and the source partition's
(``<name>.<topic>.<partition>``), and each transaction also commits, as the offset of
the consumer group ``<name>`` for that source partition, the source offset after the
last record whose outputs it holds. Invariant: a record's outputs are visible to
``read_committed`` readers if and only if the group's offset for its partition is
past it. Hence:

- a re-run of the task (a task retry, a lost executor, the query restarted from its
  checkpoint) first asks the group how far the partition is written and skips the
  records before that: the handler is not called for them, nothing is written twice;
- an attempt still running elsewhere (a zombie) is fenced: a producer started with
  the same ``transactional.id`` aborts the transaction it left open, and the
  zombie's later calls fail;
- a transaction covers at most :data:`COMMIT_EVERY_S` of handling, well inside the
  transaction timeout, however long a batch is: a slow batch commits in steps, and
  a re-run resumes after the last step.

What the handler does besides returning its value stays at least once: a record
whose transaction did not commit is handled again.

Producers live as long as their Python worker (Spark reuses workers), one per
source partition: a task of the next batch begins its transaction at once, from the
offset the producer's last commit reached (no producer of the same id wrote since,
or it would have been fenced). A producer fenced meanwhile (the partition's task ran
in another worker) is replaced and the group's offset read again; one fenced in the
middle of a transaction makes it again from the outputs it kept, if the group's
offset is still where this transaction began; otherwise the task fails and Spark
runs it again.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from redrive.client_logs import with_client_logs
from redrive.headers import REASON, SEND_TO, Header
from redrive.kafka import UNASSIGNED_PARTITION, produce_patiently
from redrive.partitioners import DEFAULT_PARTITIONER, placed_by
from redrive.transactional import TIMEOUT_S, retry_transactional

if TYPE_CHECKING:
    import pyarrow as pa

    # A source batch's outputs (OUTPUT_SCHEMA), alone or with counts to add to the
    # task's (redrive.spark.batches.Routed).
    Handle: TypeAlias = Callable[
        [pa.RecordBatch], pa.RecordBatch | tuple[pa.RecordBatch, Mapping[str, int]]
    ]

log = structlog.get_logger("redrive.spark")

_COLUMNS: Final = ("topic", "key", "value", "headers", "partition")
"""The output columns a producer sends, in the order ``_produce`` reads them."""
COMMIT_EVERY_S: Final = 5.0
"""The longest stretch of handling one transaction covers."""
SLICE_ROWS: Final = 1_000
"""Records handled between two looks at the clock."""
TRANSACTION_TIMEOUT_MS: Final = 60_000

STATS: Final = ("handled", "skipped", "results", "retried", "dead_lettered", "doubted")
STATS_SCHEMA: Final = ", ".join(f"{name} LONG" for name in STATS)
"""The one row each task returns: records handled, records skipped (their outputs
were written by an earlier attempt), the outputs committed: results, retry
requests, dead letters (told apart as :mod:`redrive.spark.observed` says), and what the
handling counted (records whose redrive headers were not believed, ``doubted``)."""


@dataclass(frozen=True)
class TransactionalTarget:
    """What the executors need to write transactionally (pickled to them)."""

    name: str
    client_config: Mapping[str, str]

    def transactional_id(self, topic: str, partition: int) -> str:
        return f"{self.name}.{topic}.{partition}"


class WrittenElsewhere(Exception):
    """Another attempt of this task committed part of its partition meanwhile."""


class _Link:
    """A transactional producer for one source partition, and the consumer that reads
    the partition's progress (and names the group in each transaction)."""

    def __init__(self, target: TransactionalTarget, topic: str, partition: int) -> None:
        common = {**target.client_config}
        self.progress = Consumer(
            with_client_logs(
                {
                    **common,
                    "group.id": target.name,
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                }
            )
        )
        self.producer = Producer(
            with_client_logs(
                {
                    **common,
                    **placed_by(DEFAULT_PARTITIONER),  # as Spark's sink, the Java producer
                    "transactional.id": target.transactional_id(topic, partition),
                    "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                    "linger.ms": 5,
                }
            )
        )
        # A connection first: librdkafka looks for the transaction coordinator on a
        # timer of half a second when it has none up yet, which every task moved to
        # another worker would wait.
        self.producer.list_topics(topic, timeout=TIMEOUT_S)
        # Aborts what an earlier producer of this id left open, and fences it.
        retry_transactional(lambda: self.producer.init_transactions(TIMEOUT_S))
        self.source = TopicPartition(topic, partition)
        self.in_transaction = False
        """True from begin to commit: a task that ended between them (an error) left
        it open, and the next one starts with a new producer, which aborts it."""
        self.reused = False
        """Kept from an earlier task: another worker may have fenced it since."""
        self.known_committed: int | None = None
        """The source offset this producer's last transaction committed, or read from
        the group: where the partition is written unless another producer of the same
        id (which fences this one) wrote since. None when unsure (a commit failed)."""

    def written_up_to(self) -> int:
        """The source offset the committed transactions reach (0: none yet). Asked
        with ``require_stable``: a transaction still committing is waited for."""
        [tp] = retry_transactional(
            lambda: self.progress.committed([self.source], timeout=TIMEOUT_S)
        )
        if tp.error is not None:
            raise KafkaException(tp.error)
        self.known_committed = max(tp.offset, 0)
        return self.known_committed

    def close(self) -> None:
        self.progress.close()


class Links:
    """The producers of one Python worker, by pipeline and source partition."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, str, int], _Link] = {}

    def get(self, target: TransactionalTarget, topic: str, partition: int, *, fresh: bool) -> _Link:
        """The partition's producer: the one kept, unless ``fresh`` is asked for or it
        was left in a transaction; else a new one (whose start fences the others)."""
        key = (target.name, topic, partition)
        old = self._kept.pop(key, None)
        if old is not None and not fresh and not old.in_transaction:
            self._kept[key] = old
            old.reused = True
            return old
        if old is not None:
            old.close()
        made = _Link(target, topic, partition)
        self._kept[key] = made
        return made


WORKER_LINKS: Final = Links()
"""This Python worker's producers: Spark reuses a worker for task after task."""


def worker_links() -> Links:
    """This worker's :data:`WORKER_LINKS`, looked up when a task runs. A function
    Spark ships to the executors is pickled with the values it holds, so one holding
    the Links object itself would bring a new, empty copy with every task; a module
    function is pickled by its name and finds the worker's own."""
    return WORKER_LINKS


class PartitionWriter:
    """One task's writes of one source partition, a transaction at a time."""

    def __init__(
        self,
        target: TransactionalTarget,
        topic: str,
        partition: int,
        links: Links = WORKER_LINKS,
    ) -> None:
        self.target = target
        self.topic = topic
        self.partition = partition
        self.links = links
        self.link = links.get(target, topic, partition, fresh=False)
        known = self.link.known_committed if self.link.reused else None
        self.committed = self.link.written_up_to() if known is None else known
        self.next_offset = self.committed
        self.outputs: list[pa.RecordBatch] = []
        """The open transaction's outputs, kept to make it again after an error."""
        self.open_since: float | None = None
        self.adding: Counter[str] = Counter()
        self.written: Counter[str] = Counter()
        """Outputs committed, by kind."""
        if self.link.reused:
            self._check_current()

    def _check_current(self) -> None:
        """Open the transaction with a reused producer and ask its coordinator at once
        (the offsets as they are: committing them moves nothing) whether a producer
        of another worker fenced it: then a new one takes over, reading how far the
        partition is written, before any row is produced. Not fenced, no other
        producer of its id wrote since its own last commit, which it remembers."""
        try:
            self._begin()
            self._send_offsets(self.committed)
        except KafkaException as exc:
            self.open_since = None
            if not _fatal(exc):
                self._again(exc)
                return
            self.link = self.links.get(self.target, self.topic, self.partition, fresh=True)
            self.committed = self.next_offset = self.link.written_up_to()

    def unwritten(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The records of ``batch`` whose outputs are not committed yet."""
        import pyarrow.compute as pc

        if batch.num_rows == 0 or batch.column("offset")[0].as_py() >= self.committed:
            return batch
        return batch.filter(pc.greater_equal(batch.column("offset"), self.committed))

    def add(self, outputs: pa.RecordBatch, next_offset: int) -> None:
        """Write ``outputs`` (in OUTPUT_SCHEMA) in the open transaction, which then
        reaches ``next_offset`` in the source."""
        self.outputs.append(outputs)
        try:
            if self.open_since is None:
                self._begin()
            self.adding.update(self._produce(outputs))
        except KafkaException as exc:
            self._again(exc)  # the transaction so far, these outputs included
        self.next_offset = next_offset

    def due(self) -> bool:
        return self.open_since is not None and time.monotonic() - self.open_since >= COMMIT_EVERY_S

    def commit(self) -> None:
        """Commit the open transaction with the source offset it reaches."""
        if self.open_since is None:
            return
        self.link.known_committed = None  # until the commit is known to have passed
        try:
            self._commit()
        except KafkaException as exc:
            self._again(exc)
            self._commit()
        self.written.update(self.adding)
        self.adding.clear()
        self.outputs = []
        self.open_since = None
        self.committed = self.link.known_committed = self.next_offset

    def _again(self, exc: KafkaException) -> None:
        """Open the transaction again with the rows it holds, after ``exc``: with a new
        producer after a fatal error (fenced: the partition's task ran in another
        worker since), if nothing was committed meanwhile; after an abortable one, with
        the same. Any other error is raised."""
        error = exc.args[0]
        if _fatal(exc):
            self.link = self.links.get(self.target, self.topic, self.partition, fresh=True)
            if self.link.written_up_to() != self.committed:
                raise WrittenElsewhere(
                    f"{self.topic}[{self.partition}] was written past offset {self.committed} "
                    "by another attempt; this one gives way"
                ) from exc
        elif error.txn_requires_abort():
            retry_transactional(lambda: self.link.producer.abort_transaction(TIMEOUT_S))
        else:
            raise exc
        if self.outputs:
            log.info(
                "transaction made again",
                topic=self.topic,
                partition=self.partition,
                rows=sum(outputs.num_rows for outputs in self.outputs),
                error=error.str(),
            )
        self._begin()
        self.adding.clear()
        for outputs in self.outputs:
            self.adding.update(self._produce(outputs))

    def _begin(self) -> None:
        self.link.producer.begin_transaction()
        self.link.in_transaction = True
        self.open_since = time.monotonic()

    def _produce(self, outputs: pa.RecordBatch) -> Counter[str]:
        """Queue ``outputs`` in the open transaction; how many of each kind."""
        producer = self.link.producer
        columns = [outputs.column(name).to_pylist() for name in _COLUMNS]
        kinds: Counter[str] = Counter()
        plain = 0
        for topic, key, value, pairs, partition in zip(*columns, strict=True):
            headers = [(h["key"], h["value"]) for h in pairs] if pairs else []
            if headers:
                kinds[_kind(headers)] += 1
            else:
                plain += 1
            by = UNASSIGNED_PARTITION if partition is None else partition
            try:  # the common case without a wrapper's call; a full queue below
                producer.produce(topic, value, key, by, _raise_refused, headers=headers)
            except BufferError:
                produce_patiently(
                    producer,
                    topic,
                    key=key,
                    value=value,
                    headers=headers,
                    on_delivery=_raise_refused,
                    partition=partition,
                )
        kinds["results"] += plain
        return kinds

    def _send_offsets(self, offset: int) -> None:
        producer = self.link.producer
        offsets = [TopicPartition(self.topic, self.partition, offset)]
        group = self.link.progress.consumer_group_metadata()
        retry_transactional(lambda: producer.send_offsets_to_transaction(offsets, group, TIMEOUT_S))

    def _commit(self) -> None:
        self._send_offsets(self.next_offset)
        retry_transactional(lambda: self.link.producer.commit_transaction(TIMEOUT_S))
        self.link.in_transaction = False


def _raise_refused(error: KafkaError | None, message: Any) -> None:
    """A record the broker refused fails the transaction's commit, so the task; it
    is logged with where it was going."""
    if error is not None:
        log.error(
            "output record refused",
            topic=message.topic(),
            partition=message.partition(),
            error=error.str(),
        )


def write_exactly_once(
    target: TransactionalTarget,
    handle: Handle,
    links: Links | None = None,
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of an exactly-once pipeline: ``handle`` gives each
    source batch's outputs (and, if it counts, its counts), written here with
    ``links``' producers (the worker's unless given); the task returns one row in
    STATS_SCHEMA."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        producers = worker_links() if links is None else links
        writer: PartitionWriter | None = None
        handled = skipped = 0
        counted: Counter[str] = Counter()
        for batch in batches:
            for start in range(0, batch.num_rows, SLICE_ROWS):
                piece = batch.slice(start, SLICE_ROWS)
                writer = _writer_for(writer, target, piece, producers)
                todo = writer.unwritten(piece)
                skipped += piece.num_rows - todo.num_rows
                if todo.num_rows == 0:
                    continue
                outputs = handle(todo)
                if isinstance(outputs, tuple):
                    outputs, counts = outputs
                    counted.update(counts)
                writer.add(outputs, todo.column("offset")[-1].as_py() + 1)
                handled += todo.num_rows
                if writer.due():
                    writer.commit()
        written: Counter[str] = Counter()
        if writer is not None:
            writer.commit()
            written = writer.written
        yield stats_batch({"handled": handled, "skipped": skipped, **written, **counted})

    return run


def _writer_for(
    writer: PartitionWriter | None,
    target: TransactionalTarget,
    piece: pa.RecordBatch,
    links: Links,
) -> PartitionWriter:
    topics = piece.column("topic").unique().to_pylist()
    partitions = piece.column("partition").unique().to_pylist()
    if (
        len(topics) != 1
        or len(partitions) != 1
        or (writer is not None and (writer.topic, writer.partition) != (topics[0], partitions[0]))
    ):
        raise ValueError(
            "exactly-once output needs one source partition per task; the Kafka source "
            "gives that unless minPartitions splits partitions"
        )
    if writer is None:
        writer = PartitionWriter(target, topics[0], partitions[0], links)
    return writer


def _fatal(exc: KafkaException) -> bool:
    """The producer cannot go on (fenced): a new one must take over."""
    error = exc.args[0]
    return bool(error.fatal() or error.code() == KafkaError._FATAL)


def _kind(headers: list[Header]) -> str:
    """An output's kind, by its headers (see :mod:`redrive.spark.observed`)."""
    names = {name for name, _ in headers}
    if REASON in names:
        return "dead_lettered"
    return "retried" if SEND_TO in names else "results"


def stats_batch(counts: Mapping[str, int]) -> pa.RecordBatch:
    """A task's one row in STATS_SCHEMA (a count not given is 0)."""
    import pyarrow as pa

    return pa.RecordBatch.from_pydict(
        {name: [counts.get(name, 0)] for name in STATS},
        schema=pa.schema([(name, pa.int64()) for name in STATS]),
    )
