"""The pipeline on the executors: each Arrow batch of source records through the handler.

``mapInArrow`` hands a Python worker whole Arrow batches of the columns
:func:`redrive.spark.pipeline.with_retries` selects. :func:`handle_batch` gives, for
each, exactly what :class:`redrive.spark.record_handler.RecordHandler` gives record by record,
but keeps the success path lean: key, value and headers are read from Arrow column by
column, and a record's topic, partition, offset and timestamp only when it fails or
carries redrive headers (which are believed only for a return to where it was read:
:meth:`~redrive.spark.record_handler.RecordHandler.read`). Records whose redrive headers
were not believed are counted (``doubted``): in the exactly-once writer's counts, or, for
Spark's Kafka sink, in a row of their own that :func:`redrive.spark.observed.
pipeline_outcomes` counts and drops (:data:`COUNTED_SCHEMA`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from redrive.headers import Header
from redrive.router import SourceRecord, record_time
from redrive.spark.output import (
    OUTPUT_SCHEMA,
    OutputColumns,
    OutputRecord,
    arrow_schema,
    header_array,
)
from redrive.spark.record_handler import RecordHandler, as_output_value, has_redrive_headers

if TYPE_CHECKING:
    import pyarrow as pa

DOUBTED: Final = "doubted"
"""The count of records whose redrive headers were not believed."""
DOUBTED_COLUMN: Final = "redrive_doubted"
COUNTED_SCHEMA: Final = f"{OUTPUT_SCHEMA}, {DOUBTED_COLUMN} LONG"
""":data:`OUTPUT_SCHEMA` and a count: a batch's rows, the count null, then, when some
records were doubted, one row of nulls but their count (see :func:`handle_batches`)."""


class Routed(NamedTuple):
    """A batch's outputs (in OUTPUT_SCHEMA), and what was counted on the way."""

    outputs: pa.RecordBatch
    counts: Mapping[str, int]


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

    def _read(self) -> tuple[list[Any], ...]:
        if self._columns is None:
            names = ("topic", "partition", "offset", "timestamp_ms")
            self._columns = tuple(self._batch.column(name).to_pylist() for name in names)
        return self._columns

    def at(self, row: int) -> tuple[str, int, int]:
        """Where the record of ``row`` was read: topic, partition, offset."""
        topics, partitions, offsets, _ = self._read()
        return topics[row], partitions[row], offsets[row]

    def record(
        self, row: int, key: bytes | None, value: bytes | None, headers: list[Header]
    ) -> SourceRecord:
        topics, partitions, offsets, timestamps = self._read()
        return SourceRecord(
            topics[row],
            partitions[row],
            offsets[row],
            record_time(timestamps[row]),
            key,
            value,
            headers,
        )


def handle_batch(
    record_handler: RecordHandler, batch: pa.RecordBatch, counts: Counter[str] | None = None
) -> pa.RecordBatch:
    """Handle each record of one Arrow batch (the columns the module docstring names).

    The outcome is what calling ``record_handler`` on each record gives, in the same
    order, but the success path stays lean: only key, value and headers are converted
    from Arrow, a :class:`SourceRecord` is built only for a record that failed, and
    when every record gave a value (the usual batch) the output is assembled from
    whole columns, the input's keys passed through as they are. ``counts`` gains the
    records whose redrive headers were not believed (:data:`DOUBTED`).
    """
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    headers = _header_lists(batch.column("headers"))
    coordinates = _Coordinates(batch)
    handler = record_handler.handler
    # The group's retry topic admits only returns: there, a record without headers is
    # read too (a source partition's batch is all of one topic or the other).
    every_row = _reads_retry_topic(record_handler, batch)
    results: list[bytes | None] = []
    user_headers_of: list[list[Header]] = []
    routed: dict[int, OutputRecord] = {}  # row -> its retry request or dead letter
    doubted = 0
    for row, (key, value) in enumerate(zip(keys, values, strict=True)):
        record_headers = headers[row] if headers is not None else None
        if every_row or (record_headers and has_redrive_headers(record_headers)):
            reading = record_handler.read(record_headers or [], key, value, coordinates.at(row))
            user_headers = reading.user_headers
            if reading.doubt is not None:
                doubted += 1
            if reading.refused:
                record = coordinates.record(row, key, value, record_headers or [])
                routed[row] = record_handler.refused(record, reading)
                results.append(None)
                user_headers_of.append(user_headers)
                continue
            delivery, attempt = reading.delivery, reading.attempt
        elif record_headers:  # the user's own headers only: a first delivery
            delivery, user_headers, attempt = None, list(record_headers), 1
        else:  # the common case, without a call: a first delivery, no headers
            delivery, user_headers, attempt = None, [], 1
        try:
            result = handler(key, value, user_headers, attempt)
            if result is not None and type(result) is not bytes:
                result = as_output_value(result)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:  # noqa: BLE001 - every failure of one record is routed
            record = coordinates.record(row, key, value, record_headers or [])
            routed[row] = record_handler.failed(record, delivery, user_headers, attempt, error)
            result = None
        results.append(result)
        user_headers_of.append(user_headers)
    if counts is not None and doubted:
        counts[DOUBTED] += doubted
    output_topic = record_handler.destinations.output_topic
    if not routed and None not in results:
        return _all_handled(output_topic, batch.column("key"), results, user_headers_of)
    out = OutputColumns()
    for row, result in enumerate(results):
        if result is not None:
            out.add(output_topic, keys[row], result, user_headers_of[row])
        elif row in routed:
            out.add_record(routed[row])
    return out.to_arrow()


def _reads_retry_topic(record_handler: RecordHandler, batch: pa.RecordBatch) -> bool:
    """Whether some record of ``batch`` was read on the group's retry topic."""
    destinations = record_handler.destinations
    if not destinations.per_group_topic or batch.num_rows == 0:
        return False
    topics = batch.column("topic").unique().to_pylist()
    return any(destinations.served_by(topic) is not None for topic in topics)


def route_batch(record_handler: RecordHandler, batch: pa.RecordBatch) -> Routed:
    """:func:`handle_batch`'s outputs, with its counts: what the exactly-once writer
    takes (:func:`redrive.spark.exactly_once.write_exactly_once`)."""
    counts: Counter[str] = Counter()
    return Routed(handle_batch(record_handler, batch, counts), counts)


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
            header_array(headers),
            pa.nulls(len(results), pa.int32()),
        ],
        schema=arrow_schema(),
    )


def handle_batches(
    record_handler: RecordHandler, *, counted: bool = False
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: handle each record of each Arrow batch. Its rows are
    in OUTPUT_SCHEMA; ``counted``, in :data:`COUNTED_SCHEMA`."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if not counted:
                yield handle_batch(record_handler, batch)
                continue
            counts: Counter[str] = Counter()
            yield from _with_count(handle_batch(record_handler, batch, counts), counts[DOUBTED])

    return run


def _with_count(outputs: pa.RecordBatch, doubted: int) -> Iterator[pa.RecordBatch]:
    """``outputs`` in COUNTED_SCHEMA, and a row holding ``doubted`` when it is not 0 (a
    doubted record may have written nothing, so the count cannot ride on its row)."""
    import pyarrow as pa

    yield outputs.append_column(DOUBTED_COLUMN, pa.nulls(outputs.num_rows, pa.int64()))
    if doubted:
        empty = [pa.nulls(1, field.type) for field in arrow_schema()]
        yield pa.RecordBatch.from_arrays(
            [*empty, pa.array([doubted], pa.int64())],
            names=[*arrow_schema().names, DOUBTED_COLUMN],
        )
