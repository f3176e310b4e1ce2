"""What redrive's Spark queries write: rows for the Kafka sink, each naming its topic.

The pipeline (:mod:`redrive.spark.pipeline`) and the Spark scheduler
(:mod:`redrive.spark.scheduler`) both end in ONE Kafka write whose rows are in
:data:`OUTPUT_SCHEMA`. An :class:`OutputRecord` is one such row in Python; the
pipeline's ``mapInArrow`` stage hands Spark Arrow batches of them (:func:`to_arrow`,
:class:`OutputColumns`), the scheduler's ``transformWithStateInPandas`` pandas frames
(:func:`frame`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Final

from redrive.headers import DEAD_LETTER_REASON, Header

if TYPE_CHECKING:
    import pyarrow as pa

    from redrive.records import DeadLetterRecord

OUTPUT_SCHEMA: Final = (
    "topic STRING, key BINARY, value BINARY, "
    "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, partition INT"
)
"""The columns of the rows a query writes: what the Kafka sink takes, with no ``topic``
option. ``partition`` is null unless a message goes to a given partition."""


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """One row of the output DataFrame: a message for the Kafka sink."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    partition: int | None = None


# ------------------------------------------------------------------------ as Arrow


@cache
def header_type() -> pa.DataType:
    """A Kafka header as the connector types it: ``STRUCT<key: STRING, value: BINARY>``."""
    import pyarrow as pa

    return pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])


@cache
def arrow_schema() -> pa.Schema:
    """:data:`OUTPUT_SCHEMA` in Arrow."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("topic", pa.string()),
            pa.field("key", pa.binary()),
            pa.field("value", pa.binary()),
            pa.field("headers", pa.list_(header_type())),
            pa.field("partition", pa.int32()),
        ]
    )


def header_array(rows: list[list[Header]]) -> pa.ListArray:
    """The headers column, built from flat arrays of names and values and the offsets
    of each row's list (much cheaper than converting a dict per header). A row without
    headers is an empty list, not null."""
    import pyarrow as pa

    header = header_type()
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


class OutputColumns:
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
                header_array(self.headers),
                pa.array(self.partitions, pa.int32()),
            ],
            schema=arrow_schema(),
        )


def to_arrow(rows: Sequence[OutputRecord]) -> pa.RecordBatch:
    """Output rows as one Arrow batch in :data:`OUTPUT_SCHEMA`."""
    out = OutputColumns()
    for row in rows:
        out.add_record(row)
    return out.to_arrow()


# ----------------------------------------------------------------------- as pandas


def frame(rows: Sequence[OutputRecord]) -> Any:
    """Output rows as a pandas DataFrame in :data:`OUTPUT_SCHEMA` (object columns, so
    that PySpark's Arrow conversion behaves the same with pandas 2 and 3)."""
    import pandas as pd

    def column(values: list[Any]) -> Any:
        return pd.Series(values, dtype=object)

    return pd.DataFrame(
        {
            "topic": column([r.topic for r in rows]),
            "key": column([r.key for r in rows]),
            "value": column([r.value for r in rows]),
            "headers": column([[{"key": k, "value": v} for k, v in r.headers] for r in rows]),
            "partition": column([r.partition for r in rows]),
        }
    )


def dlq_record(
    message: DeadLetterRecord | OutputRecord, reason: str, dlq_topic: str
) -> OutputRecord:
    """A refused request, or a pending message that will not be delivered, on the DLQ
    topic as ``redrive serve`` mirrors it: its key, value and headers, plus
    ``redrive-dead-letter-reason`` (the reason text; the service's reason code is a
    column of its store and a metric label, and has no place here)."""
    headers = [*message.headers, (DEAD_LETTER_REASON, reason.encode())]
    return OutputRecord(dlq_topic, message.key, message.value, headers)
