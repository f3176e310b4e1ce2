"""The pipeline on the executors: each Arrow batch of source records through the handler.

``mapInArrow`` hands a Python worker whole Arrow batches of the columns
:func:`redrive.spark.pipeline.with_retries` selects. :func:`handle_batch` gives, for
each, exactly what :class:`redrive.spark.record_handler.RecordHandler` gives record by record,
but keeps the success path lean: key, value and headers are read from Arrow column by
column, and a record's topic, partition, offset and timestamp only when it fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from redrive.headers import Header
from redrive.router import SourceRecord, record_time
from redrive.spark.output import OutputColumns, OutputRecord, arrow_schema, header_array
from redrive.spark.record_handler import RecordHandler, as_output_value

if TYPE_CHECKING:
    import pyarrow as pa


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


def handle_batch(record_handler: RecordHandler, batch: pa.RecordBatch) -> pa.RecordBatch:
    """Handle each record of one Arrow batch (the columns the module docstring names).

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
                result = as_output_value(result)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:  # noqa: BLE001 - every failure of one record is routed
            record = coordinates.record(row, key, value, record_headers or [])
            routed[row] = record_handler.failed(record, delivery, user_headers, attempt, error)
            result = None
        results.append(result)
        user_headers_of.append(user_headers)
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
    record_handler: RecordHandler,
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: handle each record of each Arrow batch."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield handle_batch(record_handler, batch)

    return run
