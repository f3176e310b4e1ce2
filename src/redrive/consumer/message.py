"""The message a handler receives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redrive.headers import Header, RetryHeaders


@dataclass(slots=True)
class Message:
    """One Kafka record handed to a handler, with what redrive knows about its past.

    ``attempt`` counts handler runs for this record: 1 on its first delivery, n + 1 after
    n failures (whichever strategy brought it back). ``value`` is what the handler's
    deserializer made of the bytes (the bytes themselves without one); ``raw_value``
    is always the bytes. ``headers`` are the user's own headers only; the redrive ones
    are read into ``retry``. (Not frozen: a frozen dataclass costs a slow
    ``object.__setattr__`` per field, on every record.)
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: Any
    raw_value: bytes | None
    headers: list[Header]
    timestamp_ms: int | None
    attempt: int
    retry: RetryHeaders | None
    """The redrive headers of a redelivered record (None on a first delivery)."""
    delivery_count: int | None = None
    """On a share group (:mod:`redrive.consumer.share`): how many times the broker has
    delivered this copy of the record (1 the first time); None on a consumer group."""
    replay: tuple[int, int] | None = None
    """``(replays, replayed from)`` of a record replayed from the retry service's dead
    letters: how many times it has been replayed, and the id of the dead letter it was
    replayed from (``redrive-replays``, ``redrive-replay-of``); None: not a replay."""
    run: int | None = None
    """The run of its key's queue the retry service delivered it in with the records of
    its key waiting behind it (``redrive-run``, ``ordering="key"``); None otherwise."""

    @property
    def original_topic(self) -> str:
        """The topic the record was first consumed from (itself on a first delivery)."""
        if self.retry is not None and self.retry.original_topic:
            return self.retry.original_topic
        return self.topic

    @property
    def original_partition(self) -> int:
        """The partition the record was first consumed from (a per-group retry topic's
        partition has its number; its own on a first delivery)."""
        if self.retry is not None and self.retry.original_partition is not None:
            return self.retry.original_partition
        return self.partition

    @property
    def original_offset(self) -> int:
        if self.retry is not None and self.retry.original_offset is not None:
            return self.retry.original_offset
        return self.offset

    def header(self, name: str) -> bytes | None:
        """The last value of one of the user's headers, or None."""
        found = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found
