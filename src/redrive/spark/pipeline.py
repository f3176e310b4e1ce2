"""The pipeline building block: a per-record handler on Spark, with retries and dead letters.

A Spark Structured Streaming job reads its source topics with the Kafka connector
(``includeHeaders=true``) and calls :func:`with_retries` on that DataFrame. Each
record goes through the user's handler on the executors, in an Arrow ``mapInArrow``
stage (batches of records, no row-at-a-time UDF). Every failure is caught for that
record alone and routed, so that the result is ONE DataFrame for ONE Kafka write,
with a ``topic`` column per row:

====================  ===================  ============================================
outcome               ``topic``            what is written
====================  ===================  ============================================
handler returned      the output topic     key, the returned value, the user's headers
bytes
retryable failure     the requests topic   key, value and user's headers untouched,
                                           plus the contract headers of the retry
                                           (attempt, retry-at, deadline, original-*,
                                           group, error-*), byte-identical to what the
                                           Python consumer writes
fatal, or policy      the requests topic   the same, with ``redrive-send-to: dlq`` and
spent                 (``send_to="dlq"``   ``redrive-reason``: the retry service stores
                      for the service's    it as a dead letter. With
                      dead-letter store)   ``dead_letters="topic"``: a DLQ topic instead
====================  ===================  ============================================

A retry's destination is the record's original topic, or with
``per_group_retry_topic=True`` the per-group topic ``<group>.<topic>.retry`` (which
:func:`start_pipeline` then reads too), so other consumer groups of ``<topic>`` do not
see this pipeline's retries. The retry service (``redrive serve``) or the Spark
scheduler (:mod:`redrive.spark.scheduler`) delivers it there when due; the pipeline
reads it again, learns its attempt count from its headers
(:func:`redrive.headers.read_delivery_headers`) and calls the handler once more.

What a failure becomes is the failure router's decision (:mod:`redrive.router`), the
same as in the Python consumer; this module only says where retries and dead letters
go. The query never fails because of a record: a handler raising anything (any
``BaseException`` but ``KeyboardInterrupt`` and ``SystemExit``), returning a wrong
type, or a policy whose predicate raises, all end as a retry or a dead letter.
Delivery is at-least-once: after a crash Spark runs the last micro-batch again, so
the handler may see a record twice and a result may be written twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, TypedDict, Unpack

from redrive.headers import Header, HeaderError, RetryHeaders, encode, is_redrive_header
from redrive.policy import Policy
from redrive.policy import policy as make_policy
from redrive.router import (
    DeadLettered,
    FailedRecord,
    RetryTarget,
    Router,
    now_ms,
    read_delivery,
    record_time,
)

if TYPE_CHECKING:
    import pyarrow as pa

Handler: TypeAlias = Callable[[bytes | None, bytes | None, list[Header], int], bytes | None]
"""``handler(key, value, headers, attempt) -> output value``.

``headers`` are the record's own headers (the ``redrive-*`` ones removed), in order;
``attempt`` counts handler runs for this record: 1 on its first delivery, n + 1 after n
failures. Return the value to write to the output topic, or None to write nothing.
Raise to fail: the policy decides between a retry and a dead letter.
"""

DeadLetterTarget: TypeAlias = Literal["service", "topic"]

OUTPUT_SCHEMA: Final = (
    "topic STRING, key BINARY, value BINARY, "
    "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, partition INT"
)
"""The columns of the DataFrame :func:`with_retries` returns: what the Kafka sink takes.
``partition`` is null unless a retry goes back to the partition it came from."""

REQUIRED_COLUMNS: Final = ("key", "value", "topic", "partition", "offset", "timestamp", "headers")


def retry_topic(group: str, topic: str) -> str:
    """The per-group retry topic of ``topic`` (DESIGN section 2): ``<group>.<topic>.retry``."""
    return f"{group}.{topic}.retry"


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One record of the source stream, as the handler stage sees it."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None
    headers: list[Header]


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """One row of the output DataFrame: a message for the Kafka sink."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    partition: int | None = None


@dataclass(frozen=True)
class Routing:
    """Where the outcomes of the handler go. Validated when built.

    ``dead_letters="service"`` sends dead letters to ``requests_topic`` with
    ``redrive-send-to: dlq`` so that they land in the retry service's dead-letter
    store; ``"topic"`` sends them to ``dlq_topic`` (default: ``<original topic>.dlq``)
    with the same headers.
    """

    output_topic: str
    group: str
    requests_topic: str = "redrive.requests"
    per_group_retry_topic: bool = False
    dead_letters: DeadLetterTarget = "service"
    dlq_topic: str | None = None

    def __post_init__(self) -> None:
        # RetryHeaders checks topic names and the group the way the contract does.
        for name in (self.output_topic, self.requests_topic, self.dlq_topic):
            if name is not None:
                _valid_headers(name, group=self.group)
        if self.per_group_retry_topic:  # the group becomes part of a topic name
            _valid_headers(retry_topic(self.group, "t"), group=self.group)
        if self.dead_letters not in ("service", "topic"):
            raise ValueError(
                f"dead_letters must be 'service' or 'topic', got {self.dead_letters!r}"
            )

    def retry_destination(self, original_topic: str) -> str:
        """Where a retry of a record first read from ``original_topic`` is delivered."""
        if self.per_group_retry_topic:
            return retry_topic(self.group, original_topic)
        return original_topic

    def dead_letter_topic(self, original_topic: str) -> str:
        if self.dead_letters == "service":
            return self.requests_topic
        return self.dlq_topic or f"{original_topic}.dlq"


def _valid_headers(topic: str, *, group: str) -> None:
    try:
        RetryHeaders(destination=topic, retry_at=0, group=group)
    except HeaderError as exc:
        raise ValueError(f"invalid pipeline setting: {exc}") from None


@dataclass(frozen=True)
class RecordHandler:
    """Runs the handler on one record and routes the outcome (pure Python, no Spark).

    This is what the executors run for each record; it is separate from Spark so that
    its routing can be read and tested on its own. ``clock`` returns epoch ms.
    """

    handler: Handler
    policy: Policy
    routing: Routing
    clock: Callable[[], int] = field(default=now_ms, compare=False)

    def __call__(self, record: SourceRecord) -> OutputRecord | None:
        delivery, user_headers, attempt = self.delivery(record.headers)
        try:
            result = _as_output_value(self.handler(record.key, record.value, user_headers, attempt))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:  # noqa: BLE001 - every failure of one record is routed
            return self.failed(record, delivery, user_headers, attempt, error)
        if result is None:
            return None
        return OutputRecord(self.routing.output_topic, record.key, result, user_headers)

    def delivery(self, headers: list[Header]) -> tuple[RetryHeaders | None, list[Header], int]:
        """What a record's headers say: its retry headers (None on a first delivery, or
        another group's retry), the user's headers, and the attempt about to run."""
        # Most records carry no redrive header: skip the contract parsing for them.
        if not any(is_redrive_header(name) for name, _ in headers):
            return None, list(headers), 1
        delivery = read_delivery(headers, self.routing.group)
        user_headers = [(n, v) for n, v in headers if not is_redrive_header(n)]
        return delivery, user_headers, delivery.attempt + 1 if delivery is not None else 1

    def failed(
        self,
        record: SourceRecord,
        delivery: RetryHeaders | None,
        user_headers: list[Header],
        attempt: int,
        error: BaseException,
    ) -> OutputRecord:
        """The retry request or dead letter for a record whose handler raised ``error``,
        as the failure router (:mod:`redrive.router`) decides it."""
        failure = FailedRecord(
            record.topic,
            record.partition,
            record.offset,
            record.timestamp_ms,
            record.key,
            record.value,
            user_headers,
            delivery,
            attempt,
        )
        home = record.topic
        if delivery is not None and delivery.original_topic:
            home = delivery.original_topic
        routing = self.routing
        destination = routing.retry_destination(home)
        outcome = Router(self.policy, routing.group, self.clock).route(
            failure,
            error,
            retry_to=RetryTarget.through(routing.requests_topic, destination, failure),
            dead_letters=routing.dead_letter_topic(home),
            home=home,
        )
        if isinstance(outcome, DeadLettered):
            topic, headers, partition = outcome.topic, outcome.headers, None
        else:
            # Never None here: retry_to was given, so the retry has its request.
            assert outcome.request is not None
            assert outcome.target is not None
            topic, headers, partition = (
                outcome.target.topic,
                outcome.request,
                outcome.target.partition,
            )
        return OutputRecord(
            topic, record.key, record.value, encode(headers, user_headers), partition
        )


def _as_output_value(result: object) -> bytes | None:
    if result is None or isinstance(result, bytes):
        return result
    if isinstance(result, bytearray | memoryview):
        return bytes(result)
    raise TypeError(f"the handler must return bytes or None, got {type(result).__name__}")


# ------------------------------------------------------------------------ on Spark


@cache
def _header_type() -> pa.DataType:
    """A Kafka header as the connector types it: ``STRUCT<key: STRING, value: BINARY>``."""
    import pyarrow as pa

    return pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])


@cache
def _arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("topic", pa.string()),
            pa.field("key", pa.binary()),
            pa.field("value", pa.binary()),
            pa.field("headers", pa.list_(_header_type())),
            pa.field("partition", pa.int32()),
        ]
    )


def _header_lists(column: pa.ListArray) -> list[list[Header]] | None:
    """Each row's headers as (name, value) pairs, or None when no row has any (most
    streams carry none): then nothing is converted per row. A row without headers may
    be null or an empty list."""
    if len(column.flatten()) == 0:
        return None
    return [[(h["key"], h["value"]) for h in row] if row else [] for row in column.to_pylist()]


class _Coordinates:
    """Where the records of one batch come from: topic, partition, offset, timestamp.

    Only routing a failure needs them, so they are converted from Arrow on the first
    failure of the batch, not for every record.
    """

    def __init__(self, batch: pa.RecordBatch) -> None:
        self._batch = batch
        self._columns: tuple[list[Any], ...] | None = None

    def record(
        self, row: int, key: bytes | None, value: bytes | None, headers: list[Header]
    ) -> SourceRecord:
        if self._columns is None:
            names = ("topic", "partition", "offset", "timestamp_ms")
            self._columns = tuple(self._batch.column(name).to_pylist() for name in names)
        topics, partitions, offsets, timestamps = self._columns
        return SourceRecord(
            topics[row],
            partitions[row],
            offsets[row],
            record_time(timestamps[row]),
            key,
            value,
            headers,
        )


class _Output:
    """Output rows kept column by column, for one Arrow batch in :data:`OUTPUT_SCHEMA`."""

    def __init__(self) -> None:
        self.topics: list[str] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[list[Header]] = []
        self.partitions: list[int | None] = []

    def add(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[Header],
        partition: int | None = None,
    ) -> None:
        self.topics.append(topic)
        self.keys.append(key)
        self.values.append(value)
        self.headers.append(headers)
        self.partitions.append(partition)

    def add_record(self, row: OutputRecord) -> None:
        self.add(row.topic, row.key, row.value, row.headers, row.partition)

    def to_arrow(self) -> pa.RecordBatch:
        import pyarrow as pa

        return pa.RecordBatch.from_arrays(
            [
                pa.array(self.topics, pa.string()),
                pa.array(self.keys, pa.binary()),
                pa.array(self.values, pa.binary()),
                _header_array(self.headers),
                pa.array(self.partitions, pa.int32()),
            ],
            schema=_arrow_schema(),
        )


def _header_array(rows: list[list[Header]]) -> pa.ListArray:
    """The headers column, built from flat arrays of names and values and the offsets
    of each row's list (much cheaper than converting a dict per header). A row without
    headers is an empty list, not null."""
    import pyarrow as pa

    header = _header_type()
    if not any(rows):  # no headers at all, the common case: n + 1 zero offsets
        empty = pa.StructArray.from_arrays(
            [pa.array([], pa.string()), pa.array([], pa.binary())], fields=list(header)
        )
        zeros = pa.repeat(pa.scalar(0, pa.int32()), len(rows) + 1)
        return pa.ListArray.from_arrays(zeros, empty, type=pa.list_(header))
    offsets = pa.array(list(accumulate(map(len, rows), initial=0)), pa.int32())
    names = pa.array([name for pairs in rows for name, _ in pairs], pa.string())
    values = pa.array([value for pairs in rows for _, value in pairs], pa.binary())
    pairs = pa.StructArray.from_arrays([names, values], fields=list(header))
    return pa.ListArray.from_arrays(offsets, pairs, type=pa.list_(header))


def to_arrow(rows: Sequence[OutputRecord]) -> pa.RecordBatch:
    """Output rows as one Arrow batch in :data:`OUTPUT_SCHEMA`."""
    out = _Output()
    for row in rows:
        out.add_record(row)
    return out.to_arrow()


def handle_batch(record_handler: RecordHandler, batch: pa.RecordBatch) -> pa.RecordBatch:
    """Handle each record of one Arrow batch (the columns :func:`with_retries` selects).

    The outcome is what calling ``record_handler`` on each record gives, in the same
    order, but the success path stays lean: only key, value and headers are converted
    from Arrow, a :class:`SourceRecord` is built only for a record that failed, and
    when every record gave a value (the usual batch) the output is assembled from
    whole columns, the input's keys passed through as they are.
    """
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    headers = _header_lists(batch.column("headers"))
    coordinates = _Coordinates(batch)
    handler = record_handler.handler
    results: list[bytes | None] = []
    user_headers_of: list[list[Header]] = []
    routed: dict[int, OutputRecord] = {}  # row -> its retry request or dead letter
    for row, (key, value) in enumerate(zip(keys, values, strict=True)):
        record_headers = headers[row] if headers is not None else None
        if record_headers:
            delivery, user_headers, attempt = record_handler.delivery(record_headers)
        else:  # the common case, without a call: a first delivery, no headers
            delivery, user_headers, attempt = None, [], 1
        try:
            result = handler(key, value, user_headers, attempt)
            if result is not None and type(result) is not bytes:
                result = _as_output_value(result)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:  # noqa: BLE001 - every failure of one record is routed
            record = coordinates.record(row, key, value, record_headers or [])
            routed[row] = record_handler.failed(record, delivery, user_headers, attempt, error)
            result = None
        results.append(result)
        user_headers_of.append(user_headers)
    output_topic = record_handler.routing.output_topic
    if not routed and None not in results:
        return _all_handled(output_topic, batch.column("key"), results, user_headers_of)
    out = _Output()
    for row, result in enumerate(results):
        if result is not None:
            out.add(output_topic, keys[row], result, user_headers_of[row])
        elif row in routed:
            out.add_record(routed[row])
    return out.to_arrow()


def _all_handled(
    output_topic: str, keys: pa.Array, results: list[bytes | None], headers: list[list[Header]]
) -> pa.RecordBatch:
    """The output of a batch whose every record gave a value, built column-wise."""
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(output_topic, pa.string()), len(results)),
            keys,
            pa.array(results, pa.binary()),
            _header_array(headers),
            pa.nulls(len(results), pa.int32()),
        ],
        schema=_arrow_schema(),
    )


def handle_batches(
    record_handler: RecordHandler,
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: handle each record of each Arrow batch."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield handle_batch(record_handler, batch)

    return run


class RetryOptions(TypedDict, total=False):
    """How :func:`with_retries` (and :func:`start_pipeline`) route failures."""

    requests_topic: str
    """The retry service's requests topic (default ``redrive.requests``)."""
    retry_on: Any
    fatal_on: Any
    """Exception classes, passed to the policy."""
    per_group_retry_topic: bool
    """Retries come back on ``<group>.<topic>.retry`` instead of the source topic."""
    dead_letters: DeadLetterTarget
    """``"service"`` (default) or ``"topic"``."""
    dlq_topic: str | None


def with_retries(
    df: Any,
    handler: Handler,
    *,
    policy: Any,
    output_topic: str,
    group: str,
    **options: Unpack[RetryOptions],
) -> Any:
    """Run ``handler`` on each record of a Kafka source DataFrame, with retries.

    ``df`` is a streaming (or batch) DataFrame read with the Kafka connector and
    ``includeHeaders=true``. ``policy`` is anything :func:`redrive.policy.policy`
    accepts (``"1s x3"``, a list of seconds, a :class:`Policy`); ``retry_on`` and
    ``fatal_on`` are exception classes, passed to it. Returns a DataFrame in
    :data:`OUTPUT_SCHEMA`, ready for ``writeStream.format("kafka")`` without a
    ``topic`` option (each row names its topic). Raises ``ValueError`` (or
    :class:`redrive.policy.PolicyError`) for a bad setting, before anything runs.
    """
    unknown = sorted(set(options) - set(RetryOptions.__annotations__))
    if unknown:
        raise TypeError(f"unknown option(s) {unknown}; see RetryOptions")
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        hint = ""
        if "headers" in missing:
            hint = " (read the source with .option('includeHeaders', 'true'))"
        raise ValueError(f"not a Kafka source DataFrame: no column {', '.join(missing)}{hint}")
    classification: dict[str, Any] = {}
    if options.get("retry_on") is not None:
        classification["retry_on"] = options["retry_on"]
    if options.get("fatal_on") is not None:
        classification["fatal_on"] = options["fatal_on"]
    routing = Routing(
        output_topic=output_topic,
        group=group,
        requests_topic=options.get("requests_topic", "redrive.requests"),
        per_group_retry_topic=options.get("per_group_retry_topic", False),
        dead_letters=options.get("dead_letters", "service"),
        dlq_topic=options.get("dlq_topic"),
    )
    record_handler = RecordHandler(handler, make_policy(policy, **classification), routing)
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

    # A record without headers has null headers; they go to Python as an empty array
    # instead, which the handler cannot tell apart. Spark 4.0 checks the Arrow batch
    # size after each row (spark.sql.execution.arrow.maxBytesPerBatch), and sizing an
    # Arrow list column re-walks every null row since the last non-null one: a batch of
    # null headers costs time quadratic in its length (1.3 s per 200,000 records in
    # batches of 10,000, measured), an empty array nothing.
    headers = F.coalesce(F.col("headers"), F.array().cast(df.schema["headers"].dataType))
    source = df.select(
        "topic",
        "partition",
        "offset",
        F.unix_millis(F.col("timestamp")).alias("timestamp_ms"),
        "key",
        "value",
        headers.alias("headers"),
    )
    return source.mapInArrow(handle_batches(record_handler), OUTPUT_SCHEMA)


def start_pipeline(
    spark: Any,
    bootstrap: str,
    source_topics: str | Sequence[str],
    handler: Handler,
    *,
    policy: Any,
    output_topic: str,
    group: str,
    checkpoint: str,
    trigger_interval: str = "1 second",
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
    kafka_options: Mapping[str, str] | None = None,
    query_name: str | None = None,
    **options: Unpack[RetryOptions],
) -> Any:
    """Read ``source_topics``, run :func:`with_retries`, write to Kafka; returns the query.

    With ``per_group_retry_topic`` the query also reads each ``<group>.<topic>.retry``.
    Topics it writes to must exist (the output topic, the requests topic, retry and DLQ
    topics): create them beforehand, as for any Kafka producer with topic creation
    off. ``kafka_options`` are Spark Kafka options (``kafka.security.protocol``...)
    given to both the source and the sink. ``checkpoint`` is the query's checkpoint
    folder: the read offsets live there, so a restart resumes where it stopped.
    """
    topics = [source_topics] if isinstance(source_topics, str) else list(source_topics)
    if not topics:
        raise ValueError("source_topics is empty")
    if options.get("per_group_retry_topic"):
        topics += [retry_topic(group, t) for t in topics]
    extra = dict(kafka_options or {})
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", starting_offsets)
        .option("includeHeaders", "true")
        .options(**extra)
    )
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    routed = with_retries(
        reader.load(), handler, policy=policy, output_topic=output_topic, group=group, **options
    )
    writer = (
        routed.writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .options(**extra)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=trigger_interval)
    )
    if query_name:
        writer = writer.queryName(query_name)
    return writer.start()
