"""The items application of the demo (seed 000), built on the redrive library.

Two consumers keep items in a PostgreSQL table: `create-item` inserts an item with
status PENDING, `update-item` sets its status and fails with ItemNotFound while the
item does not exist yet. The update is retried through the retry service until the
create has arrived. GET /v1/demo/items/{id}/status serves the status (404 until the
item exists).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
from fastapi import FastAPI, HTTPException

from redrive import App, Message

CREATE_TOPIC = "create-item"
UPDATE_TOPIC = "update-item"
UPDATE_POLICY = "2s x5, 5s x3"


class ItemNotFound(Exception):
    """The item an update names does not exist (yet): worth retrying."""


class ItemStore:
    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        with self._connect() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS demo_items ("
                " id text PRIMARY KEY, name text NOT NULL, status text NOT NULL,"
                " updated_at timestamptz NOT NULL DEFAULT now())"
            )

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.database_url, autocommit=True)

    def create(self, item_id: str, name: str) -> None:
        with self._connect() as conn:
            conn.execute(
                "INSERT INTO demo_items (id, name, status) VALUES (%s, %s, 'PENDING')"
                " ON CONFLICT (id) DO NOTHING",
                (item_id, name),
            )

    def update_status(self, item_id: str, status: str) -> None:
        with self._connect() as conn:
            updated = conn.execute(
                "UPDATE demo_items SET status = %s, updated_at = now() WHERE id = %s",
                (status, item_id),
            ).rowcount
        if updated == 0:
            raise ItemNotFound(f"item {item_id} not found")

    def status(self, item_id: str) -> str | None:
        with self._connect() as conn:
            row = conn.execute("SELECT status FROM demo_items WHERE id = %s", (item_id,)).fetchone()
        return None if row is None else str(row[0])


def build_app(
    bootstrap: str,
    store: ItemStore,
    *,
    requests_topic: str,
    say: Callable[[str], None],
    group: str = "items",
) -> App:
    """The items consumers: a redrive App with two handlers."""

    def on_retry(message: Message, retry: Any, error: BaseException) -> None:
        say(
            f"update-item: {error} (attempt {message.attempt}); "
            f"the retry service brings it back in {retry.delay_ms / 1000:g}s"
        )

    def on_dead_letter(message: Message | None, dead: Any, error: BaseException) -> None:
        say(f"dead letter: {dead.text}")

    app = App(
        bootstrap,
        group=group,
        requests_topic=requests_topic,
        on_retry=on_retry,
        on_dead_letter=on_dead_letter,
    )

    @app.handler(CREATE_TOPIC, policy="1s x3", strategy="service", value_deserializer=json.loads)
    def create_item(message: Message) -> None:
        event = message.value
        store.create(event["id"], event["name"])
        say(f"create-item {event['id']}: created with status PENDING")

    @app.handler(
        UPDATE_TOPIC,
        policy=UPDATE_POLICY,
        strategy="service",
        retry_on=[ItemNotFound],
        value_deserializer=json.loads,
    )
    def update_item(message: Message) -> None:
        event = message.value
        store.update_status(event["id"], event["status"])
        say(
            f"update-item {event['id']}: status set to {event['status']} "
            f"on attempt {message.attempt}"
        )

    return app


def build_api(store: ItemStore) -> FastAPI:
    api = FastAPI(title="items demo")

    @api.get("/v1/demo/items/{item_id}/status")
    def item_status(item_id: str) -> dict[str, str]:
        status = store.status(item_id)
        if status is None:
            raise HTTPException(status_code=404, detail=f"item {item_id} not found")
        return {"id": item_id, "status": status}

    return api
