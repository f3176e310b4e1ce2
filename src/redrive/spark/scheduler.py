"""The Spark scheduler: the retry service's scheduling as a streaming query.

For users who outgrow one machine, this query does what ``redrive serve``'s intake and
scheduler do, with Spark state instead of PostgreSQL:

1. Read the requests topic (``includeHeaders``), and group the requests by
   destination and message key (a request without a key is a group of its own), so
   that a key's retries stay in one place and the work spreads over partitions.
2. In ``transformWithStateInPandas`` (:class:`RetryScheduler`), check each request
   with the retry service's own :func:`redrive.requests.classify`: the same
   header contract, destination allowlist, deadline and topic checks. An invalid
   request becomes a dead letter on the DLQ topic, with the request's headers and
   ``redrive-dead-letter-reason`` carrying the same reason text the service gives.
3. Keep each valid request in the group's ``ListState`` (RocksDB state store) and
   register a processing-time timer at its ``redrive-retry-at``. A request already
   due is delivered at once.
4. When a timer fires (``handleExpiredTimer``), deliver every message of the group
   that is due: to its destination, with its original key, its ``redrive-partition``
   when set, and its headers unchanged. One whose deadline passed while it waited,
   or whose topic disappeared, is a dead letter instead.
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
against, on the executors), :mod:`redrive.spark.pending_messages` (a message as it
waits in state) and :mod:`redrive.spark.output` (the rows written).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from redrive.client_logs import with_client_logs
from redrive.errors import ConfigError
from redrive.headers import DEAD_LETTER_REASON, Header
from redrive.records import DeadLetterRecord
from redrive.requests import Incoming, IntakeRules, classify
from redrive.spark.output import OUTPUT_SCHEMA, OutputRecord, frame
from redrive.spark.pending_messages import PendingMessage
from redrive.spark.scheduler_rules import SchedulerRules
from redrive.spark.session import ROCKSDB_PROVIDER
from redrive.topic_names import DLQ_TOPIC, REQUESTS_TOPIC

try:  # PySpark is an optional dependency (the `spark` extra)
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor
except ImportError:  # pragma: no cover - only without the extra

    class StatefulProcessor:  # type: ignore[no-redef]
        """Stand-in so that this module imports without PySpark."""


PENDING_STATE: Final = "pending"
PENDING_SCHEMA: Final = "due_ms LONG, message BINARY"
"""One pending message in the ListState: its due time, and the message as JSON."""

TICK: Final = "redrive-tick"
"""The grouping key of the one tick row per micro-batch (see scheduler_dataframe)."""


def dlq_record(
    message: DeadLetterRecord | OutputRecord, reason: str, dlq_topic: str
) -> OutputRecord:
    """A refused request, or a pending message that will not be delivered, on the DLQ
    topic as ``redrive serve`` mirrors it: its key, value and headers, plus
    ``redrive-dead-letter-reason`` (the reason text; the service's reason code is a
    column of its store and a metric label, and has no place here)."""
    headers = [*message.headers, (DEAD_LETTER_REASON, reason.encode())]
    return OutputRecord(dlq_topic, message.key, message.value, headers)


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


def _headers(value: Any) -> list[Header]:
    """Kafka source headers as pandas hands them over (an array of dicts, or None)."""
    if value is None:
        return []
    return [(h["key"], None if h["value"] is None else bytes(h["value"])) for h in value]


def _optional_bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


class RetryScheduler(StatefulProcessor):
    """Per group of requests: check, keep until due, deliver (see the module docstring).

    State: ``pending``, a ListState of (due_ms, message) rows; timers: one per
    distinct due time. Both live in the RocksDB state store and its checkpoint.
    """

    def __init__(self, rules: SchedulerRules) -> None:
        self.rules = rules
        self._intake: IntakeRules | None = None

    def init(self, handle: Any) -> None:
        # Also called on the driver, only to learn the state schema: no clients here.
        self.handle = handle
        self.pending = handle.getListState(PENDING_STATE, PENDING_SCHEMA)

    @property
    def intake(self) -> IntakeRules:
        if self._intake is None:
            self._intake = self.rules.intake_rules()
        return self._intake

    def handleInputRows(  # noqa: N802 - PySpark's method name
        self,
        key: Any,
        rows: Iterator[Any],
        timerValues: Any,  # noqa: N803
    ) -> Iterator[Any]:
        if key[-1] == TICK:  # only there to make the batch run (see scheduler_dataframe)
            for _ in rows:
                pass
            yield frame([])
            return
        now = int(timerValues.getCurrentProcessingTimeInMs())
        out: list[OutputRecord] = []
        waiting: list[tuple[int, bytes]] = []
        for pdf in rows:
            for topic, partition, offset, msg_key, value, headers in zip(
                pdf["topic"],
                pdf["partition"],
                pdf["offset"],
                pdf["key"],
                pdf["value"],
                pdf["headers"],
                strict=True,
            ):
                request = Incoming(
                    str(topic),
                    int(partition),
                    int(offset),
                    _optional_bytes(msg_key),
                    _optional_bytes(value),
                    _headers(headers),
                )
                result = classify(request, self.intake, now)
                if isinstance(result, DeadLetterRecord):
                    out.append(dlq_record(result, result.reason, self.rules.dlq_topic))
                elif result.due_ms <= now:
                    out.append(PendingMessage.of(result).delivery)
                else:
                    waiting.append((result.due_ms, PendingMessage.of(result).to_bytes()))
        if waiting:
            self.pending.appendList(waiting)
            for due in sorted({due for due, _ in waiting}):
                self.handle.registerTimer(due)
        yield frame(out)

    def handleExpiredTimer(  # noqa: N802 - PySpark's method name
        self,
        key: Any,
        timerValues: Any,  # noqa: N803
        expiredTimerInfo: Any,  # noqa: N803
    ) -> Iterator[Any]:
        now = int(timerValues.getCurrentProcessingTimeInMs())
        due: list[PendingMessage] = []
        keep: list[tuple[int, bytes]] = []
        for due_ms, data in self.pending.get():
            if int(due_ms) <= now:
                due.append(PendingMessage.from_bytes(bytes(data)))
            else:
                keep.append((int(due_ms), bytes(data)))
        if not due:  # a second timer of the same group, its message already delivered
            yield frame([])
            return
        if keep:
            self.pending.put(keep)
        else:
            self.pending.clear()
        out: list[OutputRecord] = []
        for message in sorted(due, key=lambda m: (m.due_ms, m.request)):
            if message.deadline_ms is not None and message.deadline_ms < now:
                out.append(dlq_record(message.delivery, _expired(message), self.rules.dlq_topic))
            elif self.intake.partitions_of(message.delivery.topic) is None:
                out.append(dlq_record(message.delivery, _gone(message), self.rules.dlq_topic))
            else:
                out.append(message.delivery)
        yield frame(out)

    def close(self) -> None:
        pass


def _ensure_topics(admin_config: Mapping[str, str], topics: Mapping[str, int]) -> None:
    """Create the topics (name -> partitions) that do not exist yet."""
    from confluent_kafka.admin import AdminClient

    from redrive.topic_admin import ensure_topic

    admin = AdminClient(with_client_logs(admin_config))
    for topic, partitions in topics.items():
        ensure_topic(admin, topic, partitions, {})


def scheduler_dataframe(
    requests: Any,
    rules: SchedulerRules,
) -> Any:
    """The scheduler's transformation: requests (a Kafka source DataFrame read with
    ``includeHeaders``) in, a DataFrame in the Kafka sink's shape out.

    One tick row per micro-batch (the ``rate-micro-batch`` source) is mixed into the
    requests. Spark runs a micro-batch without new input only when the previous batch
    of the same run asks for one; right after a restart there is no previous batch,
    so with no new requests the restored timers would not fire until a request came.
    With a tick there is always new input, and every trigger runs a batch.
    """
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

    destination = F.expr(
        "try_element_at(filter(headers, h -> h.key = 'redrive-destination'), -1).value"
    )
    # A request without a key has no order to keep: its own group (by coordinates).
    unkeyed = F.when(F.col("key").isNull(), F.format_string("%d:%d", "partition", "offset"))
    columns = {
        "destination": "binary",
        "unkeyed": "string",
        "key": "binary",
        "topic": "string",
        "partition": "int",
        "offset": "bigint",
        "value": "binary",
        "headers": "array<struct<key: string, value: binary>>",
    }
    requests = requests.select(
        destination.alias("destination"),
        unkeyed.alias("unkeyed"),
        *[name for name in columns if name not in ("destination", "unkeyed")],
    )
    ticks = (
        requests.sparkSession.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 1)
        .load()
        .select(
            *[
                (F.lit(TICK) if name == "unkeyed" else F.lit(None)).cast(kind).alias(name)
                for name, kind in columns.items()
            ]
        )
    )
    grouped = requests.unionByName(ticks).groupBy("destination", "key", "unkeyed")
    return grouped.transformWithStateInPandas(
        statefulProcessor=RetryScheduler(rules),
        outputStructType=OUTPUT_SCHEMA,
        outputMode="Append",
        timeMode="ProcessingTime",
    )


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
    kafka_options: Mapping[str, str] | None = None,
    admin_config: Mapping[str, str] | None = None,
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = 10_000,
    create_topics: bool = True,
    query_name: str | None = "redrive-scheduler",
) -> Any:
    """Start the scheduler query; returns the ``StreamingQuery``.

    ``allowed_destinations`` are topic names or glob patterns, as ``redrive serve``'s
    setting of that name (internal topics and the requests topic are always refused).
    ``checkpoint`` keeps the read offsets, the pending messages and their timers:
    restarting with the same folder resumes with everything still pending.
    ``kafka_options`` are Spark Kafka options for the source and the sink;
    ``admin_config`` librdkafka settings for topic metadata lookups (default: the
    bootstrap only). With ``create_topics`` the requests and DLQ topics are created
    when missing. ``max_offsets_per_trigger`` bounds a micro-batch, so that a backlog
    of requests does not hold up the timers for long. The session must use the
    RocksDB state store provider (as :func:`redrive.spark.session.spark_session` does).
    """
    provider = spark.conf.get("spark.sql.streaming.stateStore.providerClass", None)
    if provider != ROCKSDB_PROVIDER:
        raise ConfigError(
            "spark.sql.streaming.stateStore.providerClass",
            f"is {provider!r}; transformWithStateInPandas needs the RocksDB provider",
            f"set it to {ROCKSDB_PROVIDER} (redrive.spark.spark_session does)",
        )
    admin = {"bootstrap.servers": bootstrap, **(admin_config or {})}
    rules = SchedulerRules.checked(
        requests_topic=requests_topic,
        dlq_topic=dlq_topic,
        allowed_destinations=allowed_destinations,
        max_delay_days=max_delay_days,
        admin_config=admin,
    )
    if create_topics:
        # As `redrive serve` creates them: the requests topic with 6 partitions.
        _ensure_topics(admin, {requests_topic: 6, dlq_topic: 1})
    extra = dict(kafka_options or {})
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", requests_topic)
        .option("startingOffsets", starting_offsets)
        .option("includeHeaders", "true")
        .options(**extra)
    )
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    writer = (
        scheduler_dataframe(reader.load(), rules)
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .options(**extra)
        .option("checkpointLocation", checkpoint)
        .outputMode("append")
        .trigger(processingTime=trigger_interval)
    )
    if query_name:
        writer = writer.queryName(query_name)
    return writer.start()


def run_scheduler(
    *,
    bootstrap: str,
    checkpoint: str,
    requests_topic: str = REQUESTS_TOPIC,
    dlq_topic: str = DLQ_TOPIC,
    allowed_destinations: Sequence[str] = ("*",),
    trigger_interval: str = "500 milliseconds",
    max_delay_days: float = 365.0,
    kafka_options: Mapping[str, str] | None = None,
    admin_config: Mapping[str, str] | None = None,
    master: str | None = "local[2]",
    spark_conf: Mapping[str, str] | None = None,
) -> None:
    """Run the scheduler until stopped (Ctrl-C, SIGTERM, or the query fails).

    Creates the SparkSession (:func:`redrive.spark.session.spark_session`, ``master``
    and ``spark_conf`` passed on), starts :func:`build_scheduler_query` and blocks.
    On Ctrl-C or SIGTERM the query is stopped cleanly and this returns; a failed query
    raises its exception (``pyspark.errors.StreamingQueryException``).
    """
    from redrive.spark.session import run_until_stopped, spark_session

    spark = spark_session("redrive-spark-scheduler", master=master, conf=spark_conf)
    try:
        query = build_scheduler_query(
            spark,
            bootstrap=bootstrap,
            requests_topic=requests_topic,
            dlq_topic=dlq_topic,
            allowed_destinations=allowed_destinations,
            checkpoint=checkpoint,
            trigger_interval=trigger_interval,
            max_delay_days=max_delay_days,
            kafka_options=kafka_options,
            admin_config=admin_config,
        )
        run_until_stopped([query])
    finally:
        spark.stop()
