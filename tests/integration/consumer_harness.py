"""Helpers for consumer-library tests: an App running in a thread, a retry service
beside it for the `service` strategy, a record of every handler call, and the
examples of docs/consumer.md run against the test's broker."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import TopicPartition

from redrive import App, Message
from redrive.consumer.running import Running
from redrive.deadlines import Deadline
from redrive.service.service import RetryService
from tests.integration.service_harness import fresh_database, now_ms, settings_for

CONSUMER_DOC = Path(__file__).resolve().parents[2] / "docs" / "consumer.md"


@dataclass
class Call:
    key: bytes | None
    value: bytes | None
    attempt: int
    at_ms: int
    topic: str
    partition: int
    headers: list[tuple[str, bytes | None]]


@dataclass
class Calls:
    """Thread-safe log of handler calls."""

    items: list[Call] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, message: Message) -> None:
        with self.lock:
            self.items.append(
                Call(
                    message.key,
                    message.raw_value,
                    message.attempt,
                    now_ms(),
                    message.topic,
                    message.partition,
                    list(message.headers),
                )
            )

    def of(self, value: bytes) -> list[Call]:
        with self.lock:
            return [c for c in self.items if c.value == value]

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        return wait_for(predicate, timeout_s)


def wait_for(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `predicate` until it holds or the deadline passes; whether it holds."""
    deadline = Deadline(timeout_s)
    while not deadline.passed():
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def in_thread(
    target: Callable[[], object], name: str
) -> tuple[threading.Thread, list[BaseException]]:
    """Start ``target`` in a daemon thread; returns the thread and the list that gets
    what it raised (an App's run, a docs example that runs one)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, errors


Consumer = TypeVar("Consumer", bound=Running)


@contextmanager
def running_app(app: Consumer) -> Iterator[Consumer]:
    """An App (or ShareApp) running in a thread until the block ends."""
    thread, errors = in_thread(lambda: app.run(install_signal_handlers=False), "test-app")
    assert app.running.wait(30) or errors, "the app did not start"
    if errors:
        raise errors[0]
    try:
        yield app
    finally:
        app.stop()
        thread.join(60)
        assert not thread.is_alive(), "the app did not stop"
    if errors:
        raise errors[0]


@contextmanager
def retry_service(bootstrap: str, database_url: str, **overrides: Any) -> Iterator[RetryService]:
    """An in-process retry service on a fresh database (for strategy `service`)."""
    settings = settings_for(bootstrap, fresh_database(database_url), **overrides)
    service = RetryService(settings)
    service.start()
    try:
        yield service
    finally:
        service.stop()


def outcome_count(app: App, topic: str, outcome: str) -> float:
    """``redrive_consumer_records_total{topic, outcome}`` of a running App (0 if unset)."""
    value = app.metrics.registry.get_sample_value(
        "redrive_consumer_records_total", {"topic": topic, "outcome": outcome}
    )
    return value or 0.0


def docs_example(heading: str, replacements: dict[str, str]) -> str:
    """The one python block under ``heading`` (``"## Batch handlers"``) of
    docs/consumer.md, before any subsection, pointed at the test's broker, topics and
    group: each key of ``replacements``, which the block must say exactly once,
    replaced by its value."""
    section = CONSUMER_DOC.read_text().split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    section = section.split("\n### ", 1)[0]  # up to its first subsection
    [block] = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    for old, new in replacements.items():
        assert block.count(old) == 1, f"the docs example no longer says {old}"
        block = block.replace(old, new)
    return block


@contextmanager
def running_example(source: str) -> Iterator[dict[str, Any]]:
    """Run a docs example that builds ``app`` and calls ``app.run()``, in a thread;
    yields its namespace once the App runs, and stops the App on the way out."""
    namespace: dict[str, Any] = {}
    code = compile(source, str(CONSUMER_DOC), "exec")
    thread, errors = in_thread(lambda: exec(code, namespace), "docs-example")
    try:
        assert wait_for(lambda: bool(errors) or "app" in namespace, 30), "the example did not start"
        assert wait_for(lambda: bool(errors) or namespace["app"].running.is_set(), 30)
        assert not errors, errors
        yield namespace
    finally:
        if isinstance(namespace.get("app"), App):
            namespace["app"].stop()
        thread.join(60)
    assert not thread.is_alive() and not errors, errors


class Flaky(Exception):
    pass


def a_group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


@contextmanager
def requests_topic_for(
    strategy: str, bootstrap: str, database_url: str, topic: str
) -> Iterator[tuple[str, str | None]]:
    """The requests topic an App of `strategy` should use, and for `service` a running
    retry service (allowed to deliver to `topic`) with its database URL."""
    if strategy != "service":
        yield "redrive.requests", None
        return
    with retry_service(bootstrap, database_url, allowed_destinations=[topic]) as service:
        yield service.settings.requests_topic, service.database_url


class Rebalances:
    """What the app's rebalance callbacks saw, recorded on the app's own thread.

    (Asking ``app._consumer.assignment()`` from the test thread can deadlock with a
    rebalance callback waiting for the GIL, so the callbacks are wrapped instead.)"""

    def __init__(self, app: App) -> None:
        self.events: list[str] = []
        self.owned: set[tuple[str, int]] = set()
        self.lock = threading.Lock()
        assign, revoke, lose = app._on_assign, app._on_revoke, app._on_lost

        def on_assign(consumer: Any, partitions: list[TopicPartition]) -> None:
            self._record("assigned", partitions)
            assign(consumer, partitions)

        def on_revoke(consumer: Any, partitions: list[TopicPartition]) -> None:
            self._record("revoked", partitions)
            revoke(consumer, partitions)

        def on_lost(consumer: Any, partitions: list[TopicPartition]) -> None:
            self._record("lost", partitions)
            lose(consumer, partitions)

        app._on_assign = on_assign  # type: ignore[method-assign]
        app._on_revoke = on_revoke  # type: ignore[method-assign]
        app._on_lost = on_lost  # type: ignore[method-assign]

    def _record(self, what: str, partitions: list[TopicPartition]) -> None:
        named = {(p.topic, p.partition) for p in partitions}
        with self.lock:
            self.events.append(f"{what} {sorted(p for _, p in named)}")
            if what == "assigned":
                self.owned |= named
            else:
                self.owned -= named

    def partitions_of(self, topic: str) -> set[int]:
        """The partitions of `topic` the app owns now."""
        with self.lock:
            return {p for t, p in self.owned if t == topic}

    def seen(self) -> list[str]:
        with self.lock:
            return list(self.events)


def waiting_partitions(app: App) -> float:
    """Partitions the app holds paused until a retry is due (its own gauge)."""
    value = app.metrics.registry.get_sample_value("redrive_consumer_waiting_partitions")
    return value or 0.0
