"""The Spark scheduler's intake: each request judged where it is read, before the buckets.

The identity a request reserves depends on its judgement (:func:`redrive.requests.
classify`): an accepted request, a consumer's own dead letter or a refusal one of our keys
vouches for keeps the identity it claims; any other refusal (a forged signature, a
destination not allowed...) is a dead letter under an identity of its own, where it was
read, so that no refused request takes the identity of a genuine one. And a repeat must
carry the content of the request it repeats (:func:`redrive.requests.content_of`). So the
repeat check (:mod:`redrive.spark.repeats`) needs the judgement first: requests are
judged here, in a ``mapInArrow`` stage on the Kafka source's own partitions (no shuffle),
and the buckets (:class:`redrive.spark.scheduler.RetryScheduler`) act on the judgement
instead of judging again.

A request keeps its columns as read (topic, partition, offset, key, value, headers:
passed through as Arrow arrays, not converted back) and gains :data:`JUDGED_COLUMNS`:
its ``identity`` and ``content`` (hex), and either its ``refusal`` (the dead letter's
reason) or what it is ``pending`` on (JSON ``[due, destination, partition, deadline]``:
JSON keeps 64-bit integers exact, which a pandas column with nulls would not).

The judgement is made at the micro-batch's time (``current_timestamp()``, which Spark
fixes per batch and keeps in the checkpoint), the time the buckets' timers use: a batch
run again judges its requests as the first run did.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final

from redrive.headers import Header
from redrive.records import DeadLetterRecord, Release
from redrive.requests import Incoming, IntakeRules, classify
from redrive.spark.repeats import KIND, MARKER, Candidate

if TYPE_CHECKING:
    import pyarrow as pa

    from redrive.spark.scheduler_rules import SchedulerRules

NOW: Final = "redrive_now_ms"
"""The input column of the batch's time, epoch ms."""
READ_COLUMNS: Final = ("topic", "partition", "offset", "key", "value", "headers")
JUDGED_COLUMNS: Final = ("identity", "content", "refusal", "pending")
JUDGED_SCHEMA: Final = (
    "topic STRING, partition INT, offset BIGINT, key BINARY, value BINARY, "
    "headers ARRAY<STRUCT<key: STRING, value: BINARY>>, "
    "identity STRING, content STRING, refusal STRING, pending STRING"
)


def header_lists(column: pa.ListArray) -> list[list[Header]]:
    """Each row's headers as (name, value) pairs, from flat arrays of the names and the
    values (no dict per header); a row without headers (null) has none."""
    if len(column) == 0:
        return []
    offsets = column.offsets.to_pylist()  # into the unsliced child, as .values is
    child = column.values
    pairs = list(zip(child.field("key").to_pylist(), child.field("value").to_pylist(), strict=True))
    valid = column.is_valid().to_pylist() if column.null_count else None
    return [
        pairs[offsets[row] : offsets[row + 1]] if valid is None or valid[row] else []
        for row in range(len(column))
    ]


def judge_batch(intake: IntakeRules, batch: pa.RecordBatch) -> pa.RecordBatch:
    """The requests of ``batch`` (:data:`READ_COLUMNS` and :data:`NOW`) judged: in
    :data:`JUDGED_SCHEMA`, one row per request (none for a release, which a scheduler
    that keeps no key order never accepts)."""
    import pyarrow as pa

    read = [batch.column(name).to_pylist() for name in ("topic", "partition", "offset")]
    keys = batch.column("key").to_pylist()
    values = batch.column("value").to_pylist()
    headers = header_lists(batch.column("headers"))
    times = batch.column(NOW).to_pylist()
    judged: dict[str, list[str | None]] = {name: [] for name in JUDGED_COLUMNS}
    released: list[int] = []
    for row, (topic, partition, offset) in enumerate(zip(*read, strict=True)):
        request = Incoming(topic, partition, offset, keys[row], values[row], headers[row])
        result = classify(request, intake, times[row])
        if isinstance(result, Release):
            released.append(row)  # never: keeps_order=False refuses every ordered request
            continue
        judged["identity"].append(None if result.identity is None else result.identity.hex())
        judged["content"].append(None if result.content is None else result.content.hex())
        if isinstance(result, DeadLetterRecord):
            judged["refusal"].append(result.reason)
            judged["pending"].append(None)
        else:
            judged["refusal"].append(None)
            pending = [result.due_ms, result.destination, result.partition, result.deadline_ms]
            judged["pending"].append(json.dumps(pending, separators=(",", ":")))
    kept = batch.select(list(READ_COLUMNS))
    if released:
        gone = set(released)
        kept = kept.take(pa.array([row for row in range(batch.num_rows) if row not in gone]))
    columns = [*kept.columns, *(pa.array(judged[name], pa.string()) for name in JUDGED_COLUMNS)]
    return pa.RecordBatch.from_arrays(columns, names=[*READ_COLUMNS, *JUDGED_COLUMNS])


def pending_of(text: str) -> tuple[int, str, int | None, int | None]:
    """A judged request's ``pending`` column: due, destination, partition, deadline."""
    due, destination, partition, deadline = json.loads(text)
    return int(due), str(destination), partition, deadline


def judge_batches(
    rules: SchedulerRules,
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function: judge each request of each Arrow batch with the
    scheduler's rules (built once per Python worker, on the executor)."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        intake = rules.intake_rules()
        for batch in batches:
            yield judge_batch(intake, batch)

    return run


def judged(requests: Any, rules: SchedulerRules) -> Any:
    """``requests`` (the Kafka source's rows, read with ``includeHeaders``) judged, in
    :data:`JUDGED_SCHEMA`."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

    read = requests.select(*READ_COLUMNS, F.unix_millis(F.current_timestamp()).alias(NOW))
    return read.mapInArrow(judge_batches(rules), JUDGED_SCHEMA)


# ------------------------------------------------------------- as a bucket reads them


def _headers(value: Any) -> list[Header]:
    """Kafka source headers as pandas hands them over (an array of dicts, or None)."""
    if value is None or isinstance(value, float):  # null, or NaN
        return []
    return [(h["key"], None if h["value"] is None else bytes(h["value"])) for h in value]


def _optional_bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def _text(value: Any) -> str | None:
    """A string column's value as pandas hands it over: str, or None for null (which
    pandas 3's string columns hold as NaN)."""
    return value if isinstance(value, str) else None


def bucket_rows(
    rows: Iterator[Any],
) -> tuple[set[str], list[Candidate], list[tuple[list[Header], str | None, str | None]]]:
    """A bucket's rows of a batch (pandas frames of judged requests and markers, as
    :func:`redrive.spark.repeats.without_repeats` gives them): the identities whose
    marker came, the requests, and each request's headers, refusal and pending."""
    markers: set[str] = set()
    candidates: list[Candidate] = []
    verdicts: list[tuple[list[Header], str | None, str | None]] = []
    for pdf in rows:
        for (
            kind,
            identity,
            topic,
            partition,
            offset,
            msg_key,
            value,
            headers,
            content,
            refusal,
            pending,
        ) in zip(
            pdf[KIND],
            pdf["identity"],
            pdf["topic"],
            pdf["partition"],
            pdf["offset"],
            pdf["key"],
            pdf["value"],
            pdf["headers"],
            pdf["content"],
            pdf["refusal"],
            pdf["pending"],
            strict=True,
        ):
            if kind == MARKER:
                markers.add(str(identity))
                continue
            read_at = (str(topic), int(partition), int(offset))
            candidates.append(
                Candidate(
                    str(identity),
                    _text(content),
                    _optional_bytes(msg_key),
                    _optional_bytes(value),
                    read_at,
                )
            )
            verdicts.append((_headers(headers), _text(refusal), _text(pending)))
    return markers, candidates, verdicts
