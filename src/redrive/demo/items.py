"""The items application of the demo, built on the redrive library.

Two consumers keep items in a PostgreSQL table: `create-item` inserts an item with
status PENDING, `update-item` sets its status and fails with ItemNotFound while the
item does not exist yet. The update is retried through the retry service until the
create has arrived; its retries come back on the group's own topics
(``items.<topic>.retry``), so that other groups reading the item topics, such as the
demo's Spark query, never see them. GET /v1/demo/items/{id}/status serves the status
(404 until the item exists); ``?engine=spark`` serves the Spark query's view.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from fastapi import FastAPI, HTTPException

from redrive import App, Message, Service
from redrive.demo.store import CREATE_TOPIC, UPDATE_TOPIC, ItemNotFound, ItemStore

__all__ = [
    "APP_GROUP",
    "CREATE_TOPIC",
    "UPDATE_POLICY",
    "UPDATE_TOPIC",
    "ItemNotFound",
    "ItemStore",
    "build_api",
    "build_app",
]

APP_GROUP = "items"
UPDATE_POLICY = "2s x5, 5s x3"


def build_app(
    bootstrap: str,
    store: ItemStore,
    *,
    requests_topic: str,
    say: Callable[[str], None],
    group: str = APP_GROUP,
) -> App:
    """The items consumers: a redrive App with two handlers, retries on per-group topics."""

    def on_retry(message: Message, retry: Any, error: BaseException) -> None:
        say(
            f"{message.original_topic}: {error} (attempt {message.attempt}); "
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

    @app.handler(
        CREATE_TOPIC,
        policy="1s x3",
        strategy=Service(per_group_topic=True),
        value_deserializer=json.loads,
    )
    def create_item(message: Message) -> None:
        event = message.value
        store.create(event["id"], event["name"])
        say(f"create-item {event['id']}: created with status PENDING")

    @app.handler(
        UPDATE_TOPIC,
        policy=UPDATE_POLICY,
        strategy=Service(per_group_topic=True),
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


def build_api(store: ItemStore, spark_store: ItemStore | None = None) -> FastAPI:
    """The items API: the App's view of an item, or with ``?engine=spark`` the Spark
    query's."""
    api = FastAPI(title="items demo")

    @api.get("/v1/demo/items/{item_id}/status")
    def item_status(item_id: str, engine: Literal["app", "spark"] = "app") -> dict[str, str]:
        chosen = spark_store if engine == "spark" else store
        if chosen is None:
            raise HTTPException(status_code=404, detail=f"no {engine} engine in this demo")
        status = chosen.status(item_id)
        if status is None:
            raise HTTPException(status_code=404, detail=f"item {item_id} not found")
        return {"id": item_id, "status": status}

    return api
