"""Helpers for consumer-library tests: an App running in a thread, a retry service
beside it for the `service` strategy, and a record of every handler call."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from redrive import App, Message
from redrive.service.service import RetryService
from tests.integration.service_harness import fresh_database, now_ms, settings_for


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
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
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


@contextmanager
def running_app(app: App) -> Iterator[App]:
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
