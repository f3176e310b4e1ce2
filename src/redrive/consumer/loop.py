"""One turn of the App's loop: poll a batch, deal with each record, record positions.

Invariants:

- a record's offset is marked for commit only once it is dealt with (see
  :mod:`redrive.consumer.offsets`); a record that must wait is sought back and its
  partition paused (:mod:`redrive.consumer.pauses`), and later records of that
  partition in the batch are skipped: they are fetched again after it;
- a record of a partition that waits (fetched before it was paused, or assigned during
  a circuit breaker) is sought back too, never handled early;
- a circuit breaker (a :class:`Wait` for all partitions) rewinds every partition to its
  first record not dealt with in the batch, then pauses them all (until the breaker's
  open time is over; the failed record's own partition until its retry is due too);
  each turn first moves the breakers whose open time is over to half-open;
- a record behind a held key may be kept in memory (:mod:`redrive.consumer.kept_lines`)
  and counts as dealt with here: the offsets' tracker holds the committed position at
  it; the records kept behind a key whose head was just done are handled right after
  the record that did it, before any later record; a record the last commit named as
  dealt with beyond its position is skipped (:mod:`redrive.consumer.done_before`);
- the loop never sleeps: the poll timeout shrinks to the next due time;
- the records of a batch that came back from a retry (a tier, a per-group topic) are
  dealt with before those of the sources, each partition's in offset order;
- a record of an async route (``async def`` handler) is taken into its lane
  (:mod:`redrive.consumer.async_records`), and its position moves once it is dealt
  with; while such records are in flight, the waiting is done in the event loop (a
  slice of at most ``TURN_S`` per turn) and Kafka is polled without waiting, and at
  most as many records are fetched as there is room for;
- a record of a batch route (``@app.batch_handler``) is taken into its route's
  pending batch, and its position moves only once that batch is through
  (:mod:`redrive.consumer.batches`); due batches are handed to their handlers at the
  end of each turn, even a turn whose poll returned nothing.

The success path is the hot path: per record only the handler call and a few dict
operations here and in :meth:`Pipeline.process`; positions and counts are recorded
once per batch, and the time spent is measured per batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka import Message as KafkaMessage

from redrive.clock import now_ms
from redrive.consumer.async_records import TURN_S, AsyncRecords
from redrive.consumer.batches import Batches
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.offsets import OffsetTracker, Partition
from redrive.consumer.pauses import PauseBook
from redrive.consumer.pipeline import Pipeline
from redrive.kafka import consume_available

log = structlog.get_logger("redrive.consumer")


def poll_once(
    consumer: Consumer,
    records: Pipeline,
    offsets: OffsetTracker,
    pauses: PauseBook,
    metrics: ConsumerMetrics,
    batch_size: int,
    poll_timeout_s: float,
    on_fatal: Callable[[KafkaError], Exception],
    batches: Batches | None = None,
    async_records: AsyncRecords | None = None,
) -> bool:
    """Poll one batch and deal with it (see the module). ``on_fatal`` makes the error
    to raise when the consumer reports itself dead (fenced, say). ``batches``: the
    pending batches of the batch routes, if any; ``async_records``: the async routes'
    records in flight, if any. Whether Kafka was polled (not when the async routes
    have no room for more records)."""
    now = now_ms()
    if records.breakers:
        records.breakers.tick(now)  # open breakers whose time is over: half-open
    if records.brakes:
        records.brakes.tick(now)  # the same of dead-letter brakes
    kept = records.kept
    if kept.roomy:  # partitions waiting for room in their kept lines that have it now
        pauses.wake(kept.roomy)
        kept.roomy.clear()
    pauses.resume_due(now)
    timeout = poll_timeout_s
    next_due = pauses.next_due_ms()
    if next_due is not None:
        timeout = min(timeout, max(next_due - now, 0) / 1000)
    if batches is not None:
        timeout = batches.timeout(timeout)
    if async_records is not None:
        room = async_records.room()
        if not room:  # full: the event loop runs until a record leaves
            _run_async(async_records, records, metrics, timeout)
            return False
        batch_size = min(batch_size, room)
        if async_records.in_flight.count:
            # Handlers await: the waiting is done in the event loop, not in consume.
            batch = consume_available(consumer, batch_size, 0)
            timeout = min(timeout, TURN_S)
        else:
            batch = consume_available(consumer, batch_size, timeout)
            timeout = 0 if not batch else min(timeout, TURN_S)
    else:
        batch = consume_available(consumer, batch_size, timeout)
    if records.returns and len(batch) > 1:
        batch = returns_first(batch, records.returns)
    if not batch and (batches is None or not batches.due(time.monotonic())):
        if async_records is not None and async_records.in_flight.count:
            _run_async(async_records, records, metrics, timeout)
        return True
    rewound: set[Partition] = set()
    positions: dict[Partition, int] = {}
    records.handled.clear()
    process = records.process
    ready = records.ready
    skipped = records.done_before
    waiting = pauses.active  # refreshed when a record makes its partition wait
    batched = batches.topics if batches is not None else None
    asyncs = async_records.topics if async_records is not None else None
    arrived = time.monotonic()
    started = time.perf_counter()
    for index, record in enumerate(batch):
        error = record.error()
        if error is not None:
            # librdkafka reports a fatal consumer error as an error event of code
            # _FATAL (its fatal() flag unset): the consumer is dead, say why.
            if error.code() == KafkaError._FATAL:
                raise on_fatal(error)
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("consume error", error=error.str())
            continue
        topic, partition, offset = record.topic(), record.partition(), record.offset()
        if topic is None or partition is None or offset is None:
            continue  # only error events lack coordinates, and those were handled above
        tp = (topic, partition)
        if rewound and tp in rewound:
            continue
        if waiting and pauses.waiting(tp):
            # Fetched before its partition was paused, or assigned during a breaker.
            pauses.wait(tp, offset, pauses.until(tp))
            rewound.add(tp)
            continue
        if asyncs and topic in asyncs:
            assert async_records is not None
            not_due = async_records.accept(record, topic, partition, offset)
            if not_due is not None:  # a tier record not due yet
                pauses.wait(tp, offset, not_due.until_ms)
                waiting = True
                rewound.add(tp)
            continue  # else in its lane, positioned once dealt with
        if batched and topic in batched:
            not_due = batched[topic].take(record, topic, partition, offset, arrived)
            if not_due is not None:  # a tier record not due yet
                pauses.wait(tp, offset, not_due.until_ms)
                waiting = True
                rewound.add(tp)
            continue  # else in its batch, positioned once the batch is through
        if skipped.by_partition and skipped.skip(tp, offset):
            # Dealt with before a restart or rewind, named so by the last commit.
            records.skipped(topic, partition, offset)
            positions[tp] = offset
            continue
        try:
            outcome = process(record, topic, partition, offset)
        except Exception as exc:  # noqa: BLE001 - no record may stop the consumer
            records.unprocessable(record, topic, partition, offset, exc)
            outcome = None
        if ready:  # keys whose head is done: the records kept behind them, now
            records.drain()
        if outcome is None:
            positions[tp] = offset
            continue
        if outcome.dealt_with:  # dead-lettered, and its breaker opened: wait from the next
            positions[tp] = offset
            offset += 1
        pauses.wait(tp, offset, outcome.until_ms)
        waiting = True
        rewound.add(tp)
        if outcome.all_partitions:
            _rewind_rest(consumer, batch[index + 1 :], rewound)
            all_until = outcome.all_until_ms
            pauses.pause_all(outcome.until_ms if all_until is None else all_until)
            break
    if batches is not None:
        positions.update(batches.flush(time.monotonic()))
    for tp, offset in positions.items():
        offsets.mark(tp, offset)
    # Timed per batch, not per record: two clock reads per record cost more than
    # redrive's own work on the success path. (The event loop's slice is not: it
    # may wait for handlers that await; async calls are timed one by one, awaits
    # included, by async_records.)
    metrics.handler_seconds.inc(time.perf_counter() - started)
    if async_records is not None:
        async_records.run(timeout)
    _count(records, metrics)
    metrics.waiting_partitions.set(pauses.count())
    return True


def returns_first(batch: list[KafkaMessage], returns: frozenset[str]) -> list[KafkaMessage]:
    """The batch with the records that came back from a retry first, each partition's
    records still in offset order: a key's head back from its retry frees the records
    kept or waiting behind it, and a batch of the source's backlog would make it wait
    for no reason (order is kept per partition, not across partitions)."""
    back = [record for record in batch if record.topic() in returns]
    if not back or len(back) == len(batch):
        return batch
    return back + [record for record in batch if record.topic() not in returns]


def _run_async(
    async_records: AsyncRecords, records: Pipeline, metrics: ConsumerMetrics, timeout: float
) -> None:
    """A turn without records to take: the event loop runs, what ends is counted."""
    records.handled.clear()
    async_records.run(timeout)
    _count(records, metrics)


def _count(records: Pipeline, metrics: ConsumerMetrics) -> None:
    for topic, count in records.handled.items():
        metrics.records.labels(topic, "handled").inc(count)


def _rewind_rest(consumer: Consumer, rest: list[KafkaMessage], rewound: set[Partition]) -> None:
    """Seek each partition of the rest of a batch back to its first record there."""
    for later in rest:
        lt, lp, lo = later.topic(), later.partition(), later.offset()
        if (
            later.error() is None
            and lt is not None
            and lp is not None
            and ((lt, lp) not in rewound)
            and lo is not None
        ):
            consumer.seek(TopicPartition(lt, lp, lo))
            rewound.add((lt, lp))


def flush_batches(
    batches: Batches, records: Pipeline, offsets: OffsetTracker, metrics: ConsumerMetrics
) -> None:
    """The App stops: hand every pending batch to its handler, however young, and mark
    its records, so that the final commit covers them."""
    records.handled.clear()
    for tp, offset in batches.flush(time.monotonic(), force=True).items():
        offsets.mark(tp, offset)
    _count(records, metrics)
