"""The Spark engine's item handler: runs on Spark's Python workers, not on the driver.

One PySpark Structured Streaming query (:mod:`redrive.demo.spark_engine`) reads both
`create-item` and `update-item`; the redrive.spark handler sees a record's key, value,
headers and attempt, not its topic, so it tells the two events apart by their fields:
a create-item event has a ``name``, an update-item event a ``status`` (those of seed
000: ``{"id", "name"}`` and ``{"id", "status"}``). It keeps the Spark engine's own
view of the items in ``demo_items_spark``, through its own PostgreSQL connections
(the driver's objects do not reach the workers), and returns a small JSON of what it
applied, which the pipeline writes to its output topic and the driver narrates.

This module imports only the standard library, :mod:`redrive.demo.store` (psycopg)
and the header types: the workers import it to unpickle the handler.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from redrive.demo.store import CREATE_TOPIC, SPARK_TABLE, UPDATE_TOPIC, ItemStore
from redrive.headers import Header

if TYPE_CHECKING:
    import pyarrow as pa


@cache
def _store(database_url: str, table: str) -> ItemStore:
    # One per worker process (Spark reuses its Python workers across batches); the
    # driver created the table.
    return ItemStore(database_url, table, create=False)


def applied(event: str, item_id: str, status: str, attempt: int) -> bytes:
    """The output record: what the handler applied, on which attempt."""
    return json.dumps(
        {"event": event, "id": item_id, "status": status, "attempt": attempt},
        separators=(",", ":"),
    ).encode()


@dataclass(frozen=True)
class SparkItemHandler:
    """``handler(key, value, headers, attempt) -> bytes``: apply one item event.

    Raises ``json.JSONDecodeError`` for a value that is not JSON (fatal: a dead
    letter at once), :class:`redrive.demo.store.ItemNotFound` for an update of an
    item that does not exist yet (retried), ``ValueError`` for JSON that is not an
    item event (fatal).
    """

    database_url: str
    table: str = SPARK_TABLE

    def __call__(
        self, key: bytes | None, value: bytes | None, headers: list[Header], attempt: int
    ) -> bytes:
        event = json.loads(value or b"")
        if not isinstance(event, dict) or not isinstance(event.get("id"), str):
            raise ValueError("not an item event: expected a JSON object with an id")
        store = _store(self.database_url, self.table)
        if isinstance(event.get("status"), str):
            store.update_status(event["id"], event["status"])
            return applied(UPDATE_TOPIC, event["id"], event["status"], attempt)
        if isinstance(event.get("name"), str):
            store.create(event["id"], event["name"])
            return applied(CREATE_TOPIC, event["id"], "PENDING", attempt)
        raise ValueError("not an item event: neither a name (create) nor a status (update)")


def warm_up(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` function that passes its batches through. Run once while the
    query starts, it has Spark start its Python workers and import what the query's
    stage needs, so the first event meets a worker that is ready (Spark reuses them)."""
    import redrive.spark  # noqa: F401 - what the query's stage imports

    yield from batches
