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
``per_group_topic=True`` the per-group topic ``<group>.<topic>.retry`` (which
:func:`start_pipeline` then reads too), so other consumer groups of ``<topic>`` do not
see this pipeline's retries. The retry service (``redrive serve``) or the Spark
scheduler (:mod:`redrive.spark.scheduler`) delivers it there when due; the pipeline
reads it again, learns its attempt count from its headers
(:func:`redrive.headers.read_delivery_headers`) and calls the handler once more: if it
believes them (:mod:`redrive.returns`: they name the topic and partition it is read on
and, with ``signing``, carry a signature of ours). Otherwise a record read on a source
topic is a new record, and one read on the group's retry topic a dead letter
(:mod:`redrive.spark.record_handler`).

What a failure becomes is the failure router's decision (:mod:`redrive.router`), the
same as in the Python consumer; this module only says where retries and dead letters
go. The query never fails because of a record: a handler raising anything (any
``BaseException`` but ``KeyboardInterrupt`` and ``SystemExit``), returning a wrong
type, or a policy whose predicate raises, all end as a retry or a dead letter.

:func:`with_retries` gives that DataFrame, for a Kafka sink of the caller's: at least
once, since after a crash Spark runs the last micro-batch again and a result may be
written twice. :func:`start_pipeline` writes exactly once by default
(:mod:`redrive.spark.delivery`, :mod:`redrive.spark.exactly_once`).

Beside this module: :mod:`redrive.spark.record_handler` (one record: the handler, and where
its outcome goes), :mod:`redrive.spark.batches` (the executors' Arrow batches) and
:mod:`redrive.spark.output` (the rows written).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Final, Unpack

from redrive.policy import PolicyOptions, policy_among
from redrive.signing import KeyRing
from redrive.spark.batches import COUNTED_SCHEMA, handle_batches, route_batch
from redrive.spark.delivery import EXACTLY_ONCE, AtLeastOnce, Delivery, ExactlyOnce
from redrive.spark.exactly_once import STATS_SCHEMA, TransactionalTarget, write_exactly_once
from redrive.spark.observed import pipeline_outcomes, written_outcomes
from redrive.spark.output import OUTPUT_SCHEMA
from redrive.spark.record_handler import (
    DeadLetterTarget,
    Destinations,
    Handler,
    RecordHandler,
    retry_topic,
)
from redrive.topic_names import REQUESTS_TOPIC

__all__ = [
    "OUTPUT_SCHEMA",
    "AtLeastOnce",
    "Delivery",
    "ExactlyOnce",
    "Handler",
    "RetryOptions",
    "start_pipeline",
    "with_retries",
]


REQUIRED_COLUMNS: Final = ("key", "value", "topic", "partition", "offset", "timestamp", "headers")


class RetryOptions(PolicyOptions, total=False):
    """How :func:`with_retries` (and :func:`start_pipeline`) route failures: the
    policy's options (:class:`redrive.policy.PolicyOptions`, as the App's handlers
    take them: ``retry_on``, ``fatal_on``, ``max_attempts``, ``max_duration``...) and
    where retries and dead letters go."""

    requests_topic: str
    """The retry service's requests topic (default ``redrive.requests``)."""
    per_group_topic: bool
    """Retries come back on ``<group>.<topic>.retry`` instead of the source topic, as
    the App's ``Service(per_group_topic=True)``."""
    dead_letters: DeadLetterTarget
    """``"service"`` (default) or ``"topic"``."""
    dlq_topic: str | None
    signing: KeyRing | None
    """The keys its requests to the retry service are signed with (docs/signing.md)."""


RENAMED: Final = {"per_group_retry_topic": "per_group_topic"}


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
    record_handler = _record_handler(df, handler, policy, output_topic, group, options)
    return _source(df).mapInArrow(handle_batches(record_handler), OUTPUT_SCHEMA)


def _record_handler(
    df: Any, handler: Handler, policy: Any, output_topic: str, group: str, options: RetryOptions
) -> RecordHandler:
    """The executors' per-record step, once the DataFrame and the options are checked."""
    for old, new in RENAMED.items():
        if old in options:
            raise TypeError(f"option {old!r} is now {new!r}, as the App's handlers name it")
    unknown = sorted(set(options) - RetryOptions.__optional_keys__)
    if unknown:
        raise TypeError(f"unknown option(s) {unknown}; see RetryOptions")
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        hint = ""
        if "headers" in missing:
            hint = " (read the source with .option('includeHeaders', 'true'))"
        raise ValueError(f"not a Kafka source DataFrame: no column {', '.join(missing)}{hint}")
    destinations = Destinations(
        output_topic=output_topic,
        group=group,
        requests_topic=options.get("requests_topic", REQUESTS_TOPIC),
        per_group_topic=options.get("per_group_topic", False),
        dead_letters=options.get("dead_letters", "service"),
        dlq_topic=options.get("dlq_topic"),
    )
    return RecordHandler(
        handler, policy_among(policy, options), destinations, signing=options.get("signing")
    )


def _source(df: Any) -> Any:
    """The columns the executors read, from a Kafka source DataFrame."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

    # A record without headers has null headers; they go to Python as an empty array
    # instead, which the handler cannot tell apart. Spark 4.0 checks the Arrow batch
    # size after each row (spark.sql.execution.arrow.maxBytesPerBatch), and sizing an
    # Arrow list column re-walks every null row since the last non-null one: a batch of
    # null headers costs time quadratic in its length (1.3 s per 200,000 records in
    # batches of 10,000, measured), an empty array nothing.
    headers = F.coalesce(F.col("headers"), F.array().cast(df.schema["headers"].dataType))
    return df.select(
        "topic",
        "partition",
        "offset",
        F.unix_millis(F.col("timestamp")).alias("timestamp_ms"),
        "key",
        "value",
        headers.alias("headers"),
    )


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
    delivery: Delivery = EXACTLY_ONCE,
    trigger_interval: str = "1 second",
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
    kafka_options: Mapping[str, str] | None = None,
    query_name: str | None = None,
    **options: Unpack[RetryOptions],
) -> Any:
    """Read ``source_topics``, handle each record with retries, write to Kafka; returns
    the query.

    ``delivery`` says how outputs are written: :class:`ExactlyOnce` (the default; the
    source is then read ``read_committed``) or :class:`AtLeastOnce` (Spark's Kafka
    sink). With ``per_group_topic`` the query also reads each
    ``<group>.<topic>.retry``. Topics it writes to must exist (the output topic, the
    requests topic, retry and DLQ topics): create them beforehand, as for any Kafka
    producer with topic creation off. ``kafka_options`` are Spark Kafka options
    (``kafka.security.protocol``...) given to both the source and the sink.
    ``checkpoint`` is the query's checkpoint folder: the read offsets live there, so a
    restart resumes where it stopped.
    """
    topics = [source_topics] if isinstance(source_topics, str) else list(source_topics)
    if not topics:
        raise ValueError("source_topics is empty")
    if options.get("per_group_topic"):
        topics += [retry_topic(group, t) for t in topics]
    extra = dict(kafka_options or {})
    if isinstance(delivery, ExactlyOnce):
        if "minPartitions" in extra:
            raise ValueError(
                "minPartitions splits a source partition among tasks, and exactly-once "
                "output needs one task per partition: drop it, or use AtLeastOnce()"
            )
        # What the source reads must be committed: an upstream transaction may abort.
        extra.setdefault("kafka.isolation.level", "read_committed")
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
    df = reader.load()
    record_handler = _record_handler(df, handler, policy, output_topic, group, options)
    if isinstance(delivery, ExactlyOnce):
        target = TransactionalTarget(
            delivery.name_for(group),
            {"bootstrap.servers": bootstrap, **delivery.client_config},
        )
        written = _source(df).mapInArrow(
            write_exactly_once(target, partial(route_batch, record_handler)), STATS_SCHEMA
        )
        writer = written_outcomes(written).writeStream.format("noop")
    else:
        routed = _source(df).mapInArrow(
            handle_batches(record_handler, counted=True), COUNTED_SCHEMA
        )
        writer = (
            pipeline_outcomes(routed)
            .writeStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .options(**extra)
        )
    writer = writer.option("checkpointLocation", checkpoint).trigger(
        processingTime=trigger_interval
    )
    if query_name:
        writer = writer.queryName(query_name)
    return writer.start()
