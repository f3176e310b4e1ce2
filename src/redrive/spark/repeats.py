"""The Spark scheduler as an idempotent receiver: a request accepted before is dropped.

Every sender repeats itself after a crash (a consumer handing a failure off again, a
Spark pipeline's batch run again from its checkpoint), and the retry service drops
such repeats by the request's identity. The Spark scheduler does the same, before
its buckets, with Spark's own streaming deduplication
(``dropDuplicatesWithinWatermark``, in the JVM and the RocksDB state store: no call
from Python per request): a request whose identity the query accepted within the last
``repeat_window_ms`` is dropped, whatever became of its first copy (pending,
delivered, a dead letter).

The identity is the request's ``redrive-id``; for a request without one, its group,
original topic, partition, offset and attempt, as their header bytes (a repeat
carries the same bytes); for one that names no original record, where it was read.
Those are what :func:`redrive.requests.identity` hashes, taken from the raw headers.

The window is counted on the processing-time clock from acceptance: each request is
stamped with its micro-batch's time, so none is ever late for the watermark (which
would drop it), and an identity leaves the state once the query's clock has passed
its acceptance by the window. The count of repeats dropped is the deduplication
operator's ``numDroppedDuplicateRows`` in each progress report's ``stateOperators``
(:func:`repeats_dropped` adds them up).
"""

from __future__ import annotations

from typing import Any, Final

from redrive.headers import ATTEMPT, GROUP, ID, ORIGINAL_OFFSET, ORIGINAL_PARTITION, ORIGINAL_TOPIC

IDENTITY: Final = "redrive_identity"
ACCEPTED_AT: Final = "redrive_accepted_at"

_FAILURE_HEADERS: Final = (GROUP, ORIGINAL_TOPIC, ORIGINAL_PARTITION, ORIGINAL_OFFSET, ATTEMPT)


def header_value(name: str) -> Any:
    """The value of a request's last header called ``name`` (null if none), as a column."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

    return F.expr(f"try_element_at(filter(headers, h -> h.key = '{name}'), -1).value")


def identity_column() -> Any:
    """A request's identity as a column (see the module)."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

    failure = F.concat_ws(
        "/", *[F.coalesce(F.hex(header_value(name)), F.lit("-")) for name in _FAILURE_HEADERS]
    )
    read_at = F.format_string("r/%s/%d/%d", "topic", "partition", "offset")
    return F.coalesce(
        F.hex(header_value(ID)),
        F.when(header_value(ORIGINAL_OFFSET).isNotNull(), F.concat(F.lit("f/"), failure)),
        read_at,
    )


def without_repeats(requests: Any, window_ms: int) -> Any:
    """``requests`` (the Kafka source's rows) without those whose identity was accepted
    within the last ``window_ms``."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

    stamped = requests.withColumn(IDENTITY, identity_column()).withColumn(
        ACCEPTED_AT, F.current_timestamp()
    )
    kept = stamped.withWatermark(ACCEPTED_AT, f"{window_ms} milliseconds")
    return kept.dropDuplicatesWithinWatermark([IDENTITY]).drop(IDENTITY, ACCEPTED_AT)


def repeats_dropped(query: Any) -> int:
    """Repeats the query dropped, over the progress reports it keeps."""
    total = 0
    for progress in query.recentProgress:
        for operator in progress.stateOperators:
            if operator.operatorName == "dedupeWithinWatermark":
                total += int(operator.customMetrics.get("numDroppedDuplicateRows", 0))
    return total
