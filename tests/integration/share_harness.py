"""Share groups in tests: a group that reads from the start, and what handlers saw."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from confluent_kafka.admin import AdminClient

from redrive import Message
from redrive.consumer.share.group_terms import configure_group


def read_from_start(bootstrap: str, group: str, lock_ms: int | None = None) -> None:
    """``share.auto.offset.reset=earliest`` for the group (a share group starts at the
    end of its topics unless told); ``lock_ms``: its records' acquisition lock."""
    settings = {"share.auto.offset.reset": "earliest"}
    if lock_ms is not None:
        settings["share.record.lock.duration.ms"] = str(lock_ms)
    configure_group(AdminClient({"bootstrap.servers": bootstrap}), group, settings)


@dataclass(frozen=True)
class Call:
    consumer: str
    value: bytes
    attempt: int
    delivery_count: int | None
    retry_at: int | None
    at_ms: int


@dataclass
class Calls:
    """Each handler call of every consumer, in the order they began."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    items: list[Call] = field(default_factory=list)

    def add(self, consumer: str, message: Message) -> None:
        call = Call(
            consumer,
            message.raw_value or b"",
            message.attempt,
            message.delivery_count,
            message.retry.retry_at if message.retry is not None else None,
            int(time.time() * 1000),
        )
        with self.lock:
            self.items.append(call)

    def by_value(self) -> dict[bytes, list[Call]]:
        with self.lock:
            found: dict[bytes, list[Call]] = defaultdict(list)
            for call in self.items:
                found[call.value].append(call)
            return found

    def consumers(self) -> set[str]:
        with self.lock:
            return {call.consumer for call in self.items}
