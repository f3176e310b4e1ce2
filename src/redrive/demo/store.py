"""The demo's item events and item store (one PostgreSQL table per engine's view).

Kept free of the web and consumer imports so that Spark's Python workers, which run
the Spark handler (:mod:`redrive.demo.spark_items`), import only this and psycopg.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

CREATE_TOPIC = "create-item"
"""``{"id": ..., "name": ...}``: a new item, status PENDING."""
UPDATE_TOPIC = "update-item"
"""``{"id": ..., "status": ...}``: set an existing item's status."""

APP_TABLE = "demo_items"
"""The items as the Python App (redrive.App, group ``items``) sees them."""
SPARK_TABLE = "demo_items_spark"
"""The items as the Spark query (group ``items-spark``) sees them."""


class ItemNotFound(Exception):
    """The item an update names does not exist (yet): worth retrying."""


class ItemStore:
    """Items in one table: ``create`` inserts with status PENDING, ``update_status``
    raises :class:`ItemNotFound` while the item does not exist. Each call opens its
    own connection (the demo's volume is a handful of events)."""

    def __init__(self, database_url: str, table: str = APP_TABLE, *, create: bool = True) -> None:
        self.database_url = database_url
        self.table = table
        self._table = sql.Identifier(table)
        if create:
            with self._connect() as conn:
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {} ("
                        " id text PRIMARY KEY, name text NOT NULL, status text NOT NULL,"
                        " updated_at timestamptz NOT NULL DEFAULT now())"
                    ).format(self._table)
                )

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.database_url, autocommit=True, connect_timeout=10)

    def create(self, item_id: str, name: str) -> None:
        with self._connect() as conn:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (id, name, status) VALUES (%s, %s, 'PENDING')"
                    " ON CONFLICT (id) DO NOTHING"
                ).format(self._table),
                (item_id, name),
            )

    def update_status(self, item_id: str, status: str) -> None:
        with self._connect() as conn:
            updated = conn.execute(
                sql.SQL("UPDATE {} SET status = %s, updated_at = now() WHERE id = %s").format(
                    self._table
                ),
                (status, item_id),
            ).rowcount
        if updated == 0:
            raise ItemNotFound(f"item {item_id} not found")

    def status(self, item_id: str) -> str | None:
        with self._connect() as conn:
            row = conn.execute(
                sql.SQL("SELECT status FROM {} WHERE id = %s").format(self._table), (item_id,)
            ).fetchone()
        return None if row is None else str(row[0])
