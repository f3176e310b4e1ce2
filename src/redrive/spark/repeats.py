"""The Spark scheduler as an idempotent receiver: a request accepted before is dropped.

Every sender repeats itself after a crash (a consumer handing a failure off again, a
Spark pipeline's batch run again from its checkpoint), and the retry service drops
such repeats by the request's identity (:func:`redrive.requests.identity`). The Spark
scheduler does the same within its state: each bucket keeps the identities it
accepted in a map with a time to live, and a request whose identity is there is
dropped, whatever became of its first copy (pending, delivered, a dead letter).

Invariant: a request is kept (pending, delivered or dead-lettered) only if its
identity was not in its bucket's map, and its identity is put there in the same
batch. Identities live ``repeat_window_ms`` after their acceptance, and again after
the delivery of a message that waited longer than half of that. A repeat lands in the
bucket of its first copy: buckets are chosen by destination and key, or for a
request without a key by its ``redrive-id`` (see ``scheduler_dataframe``).

A dropped repeat leaves a marker row, counted by the query's observed metric
``redrive-scheduler`` (``repeats_dropped``, in each progress report's
``observedMetrics``) and removed before the Kafka sink.
"""

from __future__ import annotations

from typing import Any, Final

import structlog

from redrive.spark.output import OutputRecord

log = structlog.get_logger("redrive.spark.scheduler")

SEEN_STATE: Final = "seen"
SEEN_KEY_SCHEMA: Final = "identity BINARY"
SEEN_VALUE_SCHEMA: Final = "accepted LONG"
"""The identities a bucket accepted, each with when (epoch ms)."""

OBSERVATION: Final = "redrive-scheduler"
"""The name of the query's observed metrics (``observedMetrics`` in its progress)."""
REPEATS_DROPPED: Final = "repeats_dropped"

REPEAT_MARKER: Final = OutputRecord("", None, None, [])
"""The row a dropped repeat leaves: counted, then filtered out before the sink (an
empty topic name, which no message of the sink may have)."""


class SeenIdentities:
    """One bucket's map of accepted identities, made in the processor's ``init``."""

    def __init__(self, handle: Any, window_ms: int) -> None:
        self._window_ms = window_ms
        self._map = handle.getMapState(
            SEEN_STATE, SEEN_KEY_SCHEMA, SEEN_VALUE_SCHEMA, ttlDurationMs=window_ms
        )

    def repeated(self, identity: bytes) -> bool:
        return bool(self._map.containsKey((identity,)))

    def accept(self, identity: bytes, now_ms: int) -> None:
        self._map.updateValue((identity,), (now_ms,))

    def delivered(self, identity: bytes | None, accepted_ms: int | None, now_ms: int) -> None:
        """A message left: if it waited long, its identity's life starts again now, so
        that a repeat is dropped for the window after its delivery too."""
        if identity is None or accepted_ms is None:
            return
        if now_ms - accepted_ms > self._window_ms // 2:
            self._map.updateValue((identity,), (now_ms,))


def dropped(request: Any, identity: bytes) -> OutputRecord:
    """Log a dropped repeat (read at ``request``'s topic, partition and offset); its
    marker row."""
    log.info(
        "repeat dropped: its request was accepted before",
        topic=request.topic,
        partition=request.partition,
        offset=request.offset,
        identity=identity.hex(),
    )
    return REPEAT_MARKER


def counted_and_removed(output: Any) -> Any:
    """The scheduler's output with the repeats' marker rows counted (the observed
    metric) and removed."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention

    marker = F.col("topic") == F.lit(REPEAT_MARKER.topic)
    observed = output.observe(OBSERVATION, F.count(F.when(marker, 1)).alias(REPEATS_DROPPED))
    return observed.where(~marker)
