"""The Spark scheduler: the retry service's scheduling as a streaming query.

For users who outgrow one machine, this query does what ``redrive serve``'s intake and
scheduler do, with Spark state instead of PostgreSQL:

1. Read the requests topic (``includeHeaders``), and judge each request where it is
   read, with the retry service's own :func:`redrive.requests.classify`: the same
   header contract, signature check, destination allowlist, deadline and topic checks
   (:mod:`redrive.spark.scheduler_intake`). An invalid request becomes a dead letter on
   the DLQ topic, with the request's headers and ``redrive-dead-letter-reason``
   carrying the same reason text the service gives, under an identity of its own.
2. Drop the repeats of requests accepted before (by identity and content, within
   ``repeat_window_ms``), and find the forgeries: a different request under the
   identity of one accepted before is a dead letter with reason ``invalid signature``
   (:mod:`redrive.spark.repeats`).
3. Hash the requests into buckets by message key (a request without a key by its
   identity), so that a key's retries stay in one place, the work spreads over
   partitions, and the Python work is one call per bucket and batch, not one per key:
   ``transformWithStateInPandas`` (:class:`RetryScheduler`). A request already due is
   delivered at once. Any other is filed in its bucket's state by due second
   (:mod:`redrive.spark.due_index`), and the bucket keeps ONE processing-time timer,
   at its earliest due time.
4. When that timer fires (``handleExpiredTimer``), deliver every message of the bucket
   that is due, in due order: to its destination, with its original key, its
   ``redrive-partition`` when set, and its headers unchanged (its signature too, which
   names the destination: its reader believes its redrive headers by it,
   :mod:`redrive.returns`; the scheduler adds no header to a delivery, so signs none);
   then set the timer to the next due time. One whose deadline passed while it waited,
   whose topic disappeared, or that the destination's broker would refuse for good
   (too large for the topic, no key for a compacted topic: see
   :class:`~redrive.spark.scheduler_rules.DeliveryCheck`), is a dead letter instead,
   and the query goes on.
5. Deliveries and dead letters leave through ONE Kafka sink, each row naming its
   ``topic``. The query is checkpointed: Kafka offsets, state and timers survive a
   restart, and timers that came due while it was stopped fire on its first batch.

Precision: Spark fires processing-time timers only when a micro-batch runs, and
compares them with the batch's start time. A message is therefore never delivered
before it is due, but up to one trigger interval plus one batch duration late
(about 0.5-5 s with the default 500 ms trigger on a small, busy machine), not
within milliseconds as the service's scheduler. Timers must fire without traffic,
so every trigger must run a batch: Spark runs one without new input only when the
previous batch of the same run asked for it, which after a restart there is none
of. The query therefore also reads one tick row per batch (``rate-micro-batch``);
without it, timers restored from the checkpoint would wait for the next request.

Delivery is at-least-once, as everywhere in redrive: a batch that fails half-way is
run again after a restart, which may deliver some messages twice, never zero times.

Beside this module: :mod:`redrive.spark.scheduler_rules` (what requests are checked
against, on the executors), :mod:`redrive.spark.scheduler_intake` (where they are
judged), :mod:`redrive.spark.repeats` (repeats and forgeries),
:mod:`redrive.spark.due_index` (where a bucket files its messages),
:mod:`redrive.spark.pending_messages` (a message as it waits in state) and
:mod:`redrive.spark.output` (the rows written).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from redrive.errors import ConfigError
from redrive.requests import IntakeRules
from redrive.signing import SignatureCheck
from redrive.spark.delivery import EXACTLY_ONCE, Delivery
from redrive.spark.due_index import DueIndex, slot_of
from redrive.spark.observed import scheduler_outcomes
from redrive.spark.output import OUTPUT_SCHEMA, OutputRecord, dlq_record, frame
from redrive.spark.pending_messages import PendingMessage, pack, unpack
from redrive.spark.repeats import FORGED_REASON, forgeries, without_repeats
from redrive.spark.scheduler_intake import bucket_rows, judged, pending_of
from redrive.spark.scheduler_rules import DeliveryCheck, SchedulerRules
from redrive.spark.scheduler_sink import scheduler_writer
from redrive.spark.scheduler_topics import ensure_topics, request_size_limit
from redrive.spark.session import ROCKSDB_PROVIDER
from redrive.topic_names import DLQ_TOPIC, REQUESTS_TOPIC

try:  # PySpark is an optional dependency (the `spark` extra)
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor
except ImportError:  # pragma: no cover - only without the extra

    class StatefulProcessor:  # type: ignore[no-redef]
        """Stand-in so that this module imports without PySpark."""


SLOTS_STATE: Final = "slots"
SLOT_KEY_SCHEMA: Final = "slot LONG"
SLOT_VALUE_SCHEMA: Final = "messages BINARY"
"""Pending messages by slot (packed): see :mod:`redrive.spark.due_index`."""
INDEX_STATE: Final = "index"
INDEX_SCHEMA: Final = "index BINARY"
"""The bucket's :class:`~redrive.spark.due_index.DueIndex`."""

BUCKETS_PER_PARTITION: Final = 4
"""Buckets per shuffle partition unless told otherwise: a task runs its buckets one
after the other, so more buckets than partitions only add calls per batch, but a few
more even out how Spark's hash spreads them over the partitions."""
TICK_BUCKET: Final = -1
"""The grouping key of the one tick row per micro-batch (see scheduler_dataframe)."""


def _expired(message: PendingMessage) -> str:
    """Why a message whose deadline passed while it waited is not delivered, in the
    service's words (its DEADLINE_PASSED)."""
    return (
        f"deadline passed while pending: redrive-deadline {message.deadline_ms}, "
        f"due {message.due_ms}"
    )


def _gone(message: PendingMessage) -> str:
    """Why a message whose destination topic disappeared while it waited is not
    delivered, in the service's words (its UNKNOWN_DESTINATION)."""
    return f"destination topic {message.delivery.topic!r} does not exist"


class RetryScheduler(StatefulProcessor):
    """Per bucket of requests: check, keep until due, deliver (see the module docstring).

    State, in the RocksDB state store and its checkpoint: ``slots``, a MapState from
    slot to packed pending messages, and ``index``, the bucket's
    :class:`~redrive.spark.due_index.DueIndex` (which slots hold what, and the one
    timer, at the earliest due time).
    """

    def __init__(self, rules: SchedulerRules) -> None:
        self.rules = rules
        self._intake: IntakeRules | None = None
        self._check: DeliveryCheck | None = None

    def init(self, handle: Any) -> None:
        # Also called on the driver, only to learn the state schema: no clients here.
        self.handle = handle
        self.slots = handle.getMapState(SLOTS_STATE, SLOT_KEY_SCHEMA, SLOT_VALUE_SCHEMA)
        self.index = handle.getValueState(INDEX_STATE, INDEX_SCHEMA)

    @property
    def intake(self) -> IntakeRules:
        if self._intake is None:
            self._intake = self.rules.intake_rules()
        return self._intake

    @property
    def check(self) -> DeliveryCheck:
        if self._check is None:
            self._check = self.rules.delivery_check()
        return self._check

    # ------------------------------------------------------------------ the index

    def _load_index(self) -> tuple[DueIndex, bool]:
        """The bucket's index, and whether the state store has one yet."""
        stored = self.index.get()
        if stored is None:
            return DueIndex(), False
        return DueIndex.from_bytes(bytes(stored[0])), True

    def _save_index(self, index: DueIndex) -> None:
        """Store the index, and move the bucket's timer to where it says. An empty
        index is stored too, not cleared: reading a missing value makes Spark's state
        server log a warning, every batch, for every bucket without pending messages."""
        change = index.arm()
        if change.delete is not None:
            self.handle.deleteTimer(change.delete)
        if change.register is not None:
            self.handle.registerTimer(change.register)
        self.index.update((index.to_bytes(),))

    def _slot(self, slot: int) -> bytes:
        """The packed messages of a slot the index says is occupied."""
        stored = self.slots.getValue((slot,))
        if stored is None:  # the index and the slots are written in the same batch
            raise RuntimeError(f"scheduler state: the index has slot {slot}, the slots not")
        return bytes(stored[0])

    # ----------------------------------------------------------------- delivering

    def _deliver(self, messages: list[PendingMessage], now: int) -> list[OutputRecord]:
        """Due messages as output rows, in due order (so a key's leave in its order);
        one that expired, lost its topic or would be refused for good, as a dead
        letter."""
        out: list[OutputRecord] = []
        dlq = self.rules.dlq_topic
        for message in sorted(messages, key=lambda m: (m.due_ms, m.request)):
            delivery = message.delivery
            if message.deadline_ms is not None and message.deadline_ms < now:
                out.append(dlq_record(delivery, _expired(message), dlq))
            elif self.intake.partitions_of(delivery.topic) is None:
                out.append(dlq_record(delivery, _gone(message), dlq))
            elif (
                refusal := self.check.refusal(delivery, compressed=self.rules.compressed)
            ) is not None:
                out.append(dlq_record(delivery, f"delivery refused for good: {refusal}", dlq))
            else:
                out.append(delivery)
        return out

    # ------------------------------------------------------------------ new input

    def handleInputRows(  # noqa: N802 - PySpark's method name
        self,
        key: Any,
        rows: Iterator[Any],
        timerValues: Any,  # noqa: N803
    ) -> Iterator[Any]:
        if key[0] == TICK_BUCKET:  # only there to make the batch run (see scheduler_dataframe)
            for _ in rows:
                pass
            yield frame([])
            return
        now = int(timerValues.getCurrentProcessingTimeInMs())
        index, stored = self._load_index()
        # A timer due in this batch fires after the input is handled: messages that
        # are due already join it, so that a key's messages still leave in due order.
        deliver_now = index.timer is None or index.timer > now
        out: list[OutputRecord] = []
        due: list[PendingMessage] = []
        later: dict[int, list[PendingMessage]] = {}
        markers, candidates, verdicts = bucket_rows(rows)
        dlq = self.rules.dlq_topic
        for forged, candidate, (headers, refusal, pending) in zip(
            forgeries(candidates, markers), candidates, verdicts, strict=True
        ):
            request = OutputRecord(dlq, candidate.key, candidate.value, headers)
            if forged:
                out.append(dlq_record(request, FORGED_REASON, dlq))
                continue
            if pending is None:
                out.append(dlq_record(request, refusal or "", dlq))
                continue
            due_ms, destination, partition, deadline_ms = pending_of(pending)
            message = PendingMessage(
                due_ms,
                OutputRecord(destination, candidate.key, candidate.value, headers, partition),
                deadline_ms,
                candidate.read_at,
            )
            if due_ms <= now and deliver_now:
                due.append(message)
            else:
                later.setdefault(slot_of(due_ms), []).append(message)
        out += self._deliver(due, now)
        for slot, messages in later.items():
            packed = pack(messages)
            earliest = min(m.due_ms for m in messages)
            if slot in index.slots:  # append: packed messages are lines
                packed = self._slot(slot) + b"\n" + packed
                earliest = min(earliest, index.slots[slot])
            self.slots.updateValue((slot,), (packed,))
            index.file(slot, earliest)
        if later or not stored:
            self._save_index(index)
        yield frame(out)

    # ---------------------------------------------------------------- timer fired

    def handleExpiredTimer(  # noqa: N802 - PySpark's method name
        self,
        key: Any,
        timerValues: Any,  # noqa: N803
        expiredTimerInfo: Any,  # noqa: N803
    ) -> Iterator[Any]:
        now = int(timerValues.getCurrentProcessingTimeInMs())
        index, _ = self._load_index()
        index.fired(int(expiredTimerInfo.getExpiryTimeInMs()))
        due: list[PendingMessage] = []
        for slot in index.due_slots(now):
            messages = unpack(self._slot(slot))
            rest = [m for m in messages if m.due_ms > now]
            due += [m for m in messages if m.due_ms <= now]
            if rest:
                self.slots.updateValue((slot,), (pack(rest),))
            else:
                self.slots.removeKey((slot,))
            index.file(slot, min((m.due_ms for m in rest), default=None))
        self._save_index(index)
        yield frame(self._deliver(due, now))

    def close(self) -> None:
        pass


def scheduler_dataframe(
    requests: Any,
    rules: SchedulerRules,
    *,
    buckets: int | None = None,
) -> Any:
    """The scheduler's transformation: requests (a Kafka source DataFrame read with
    ``includeHeaders``) in, a DataFrame in the Kafka sink's shape out.

    Requests are judged where they are read (:mod:`redrive.spark.scheduler_intake`),
    their repeats dropped and forgeries marked (:mod:`redrive.spark.repeats`), and they
    are grouped into ``buckets`` by a hash of their message key (a request without a
    key by its identity: it has no order to keep), so that a key's requests are always
    in the same bucket, and so are the copies of one request, and the Python work is
    one call per bucket and batch, not one per key. ``buckets`` defaults to
    :data:`BUCKETS_PER_PARTITION` times ``spark.sql.shuffle.partitions``.

    One tick row per micro-batch (the ``rate-micro-batch`` source) is mixed into the
    requests. Spark runs a micro-batch without new input only when the previous batch
    of the same run asks for one; right after a restart there is no previous batch,
    so with no new requests the restored timers would not fire until a request came.
    With a tick there is always new input, and every trigger runs a batch.
    """
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

    if buckets is None:
        partitions = int(requests.sparkSession.conf.get("spark.sql.shuffle.partitions"))
        buckets = BUCKETS_PER_PARTITION * partitions
    key = F.col("key")
    spread = F.when(key.isNull(), F.xxhash64(F.lit(0), F.col("identity")))
    bucket = F.pmod(spread.otherwise(F.xxhash64(key)), F.lit(buckets)).cast("int")
    kept = without_repeats(
        judged(requests, rules).withColumn("bucket", bucket), rules.repeat_window_ms
    )
    columns = dict(kept.dtypes)
    ticks = (
        requests.sparkSession.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 1)
        .load()
        .select(
            *[
                (F.lit(TICK_BUCKET) if name == "bucket" else F.lit(None)).cast(kind).alias(name)
                for name, kind in columns.items()
            ]
        )
    )
    grouped = kept.unionByName(ticks).groupBy("bucket")
    scheduled = grouped.transformWithStateInPandas(
        statefulProcessor=RetryScheduler(rules),
        outputStructType=OUTPUT_SCHEMA,
        outputMode="Append",
        timeMode="ProcessingTime",
    )
    return scheduled


def build_scheduler_query(
    spark: Any,
    *,
    bootstrap: str,
    requests_topic: str = REQUESTS_TOPIC,
    dlq_topic: str = DLQ_TOPIC,
    allowed_destinations: Sequence[str] = ("*",),
    checkpoint: str,
    trigger_interval: str = "500 milliseconds",
    max_delay_days: float = 365.0,
    repeat_window_days: float = 7.0,
    kafka_options: Mapping[str, str] | None = None,
    admin_config: Mapping[str, str] | None = None,
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = 10_000,
    create_topics: bool = True,
    query_name: str | None = "redrive-scheduler",
    buckets: int | None = None,
    delivery: Delivery = EXACTLY_ONCE,
    signatures: SignatureCheck | None = None,
) -> Any:
    """Start the scheduler query; returns the ``StreamingQuery``.

    ``allowed_destinations`` are topic names or glob patterns, as ``redrive serve``'s
    setting of that name (internal topics and the requests topic are always refused).
    ``signatures``: what is asked of each request's ``redrive-signature``
    (:mod:`redrive.signing`); None: nothing.
    ``repeat_window_days``: how long an accepted request's identity is kept, so that a
    repeat of it is dropped (:mod:`redrive.spark.repeats`).
    ``checkpoint`` keeps the read offsets, the pending messages and their timers:
    restarting with the same folder resumes with everything still pending.
    ``kafka_options`` are Spark Kafka options for the source and the sink;
    ``admin_config`` librdkafka settings for topic metadata lookups (default: the
    bootstrap only). With ``create_topics`` the requests and DLQ topics are created
    when missing. ``max_offsets_per_trigger`` bounds a micro-batch, so that a backlog
    of requests does not hold up the timers for long. ``buckets`` is how many groups
    the requests are hashed into (by destination and key): the query's parallelism is
    at most that, and each bucket costs a few state calls per batch; the default is
    :data:`BUCKETS_PER_PARTITION` per shuffle partition. A checkpoint remembers it:
    changing it needs a new checkpoint. ``delivery``: exactly once (the default:
    :mod:`redrive.spark.scheduler_sink`) or at least once (Spark's Kafka sink). The
    session must use the RocksDB state store provider (as
    :func:`redrive.spark.session.spark_session` does).
    """
    if buckets is not None and buckets < 1:
        raise ConfigError("buckets", f"must be at least 1, got {buckets}")
    provider = spark.conf.get("spark.sql.streaming.stateStore.providerClass", None)
    if provider != ROCKSDB_PROVIDER:
        raise ConfigError(
            "spark.sql.streaming.stateStore.providerClass",
            f"is {provider!r}; transformWithStateInPandas needs the RocksDB provider",
            f"set it to {ROCKSDB_PROVIDER} (redrive.spark.spark_session does)",
        )
    admin = {"bootstrap.servers": bootstrap, **(admin_config or {})}
    extra = dict(kafka_options or {})
    rules = SchedulerRules.checked(
        requests_topic=requests_topic,
        dlq_topic=dlq_topic,
        allowed_destinations=allowed_destinations,
        max_delay_days=max_delay_days,
        repeat_window_days=repeat_window_days,
        admin_config=admin,
        compressed=extra.get("kafka.compression.type", "none") not in ("none", ""),
        signatures=signatures,
    )
    if create_topics:
        # As `redrive serve` creates them: the requests topic with 6 partitions.
        ensure_topics(admin, {requests_topic: 6, dlq_topic: 1})
    # Whatever the requests topic accepted, the sink's producer can send (the Java
    # producer's own limit, 1 MiB, is below Kafka's default topic limit): only the
    # destination's broker judges a message's size, and DeliveryCheck knows its limit.
    extra.setdefault("kafka.max.request.size", str(request_size_limit(admin, requests_topic)))
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", requests_topic)
        .option("startingOffsets", starting_offsets)
        .option("includeHeaders", "true")
        .options(**extra)
        # Not overridable: a request of a transaction aborted (or still open) is not
        # one, and Apps with transactional=True rely on that (as the service's intake).
        .option("kafka.isolation.level", "read_committed")
    )
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    released = scheduler_outcomes(scheduler_dataframe(reader.load(), rules, buckets=buckets))
    writer = (
        scheduler_writer(
            released,
            delivery,
            bootstrap=bootstrap,
            checkpoint=checkpoint,
            requests_topic=requests_topic,
            kafka_options=extra,
            max_message_bytes=int(extra["kafka.max.request.size"]),
        )
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=trigger_interval)
    )
    if query_name:
        writer = writer.queryName(query_name)
    return writer.start()
