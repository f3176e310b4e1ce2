"""Replaying dead letters: back to their topic (or another allowed one), paced.

A replayed message carries the dead letter's key, value and the user's own headers;
the redrive headers are dropped, so consumers see a fresh message with a fresh
attempt count. The destination must pass the same allowlist as retry requests and
exist: an operator cannot use replay to write where a request could not. Sending is
paced at `rate` messages per second, and each message counts only once the broker
acknowledged it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from redrive.headers import Header, is_redrive_header
from redrive.kafka import produce_patiently


class ReplayRefused(ValueError):
    """A replay that must not happen (destination not allowed, unknown); nothing was sent."""


@dataclass(frozen=True, slots=True)
class Edit:
    """What an operator changed before replaying one dead letter."""

    value: bytes | None = None
    headers: list[Header] | None = None


def replayed_message(
    row: dict[str, Any], edit: Edit | None = None
) -> tuple[bytes | None, list[Header]]:
    """The value and headers a dead letter is replayed with (its key is unchanged):
    the user's headers only, edited if asked."""
    headers = [(k, v) for k, v in row["headers"] if not is_redrive_header(k)]
    value = row["msg_value"]
    if edit is not None:
        value = edit.value if edit.value is not None else value
        if edit.headers is not None:
            # Edited headers cannot forge redrive metadata either.
            headers = [(k, v) for k, v in edit.headers if not is_redrive_header(k)]
    return value, headers


class Replayer:
    def __init__(
        self,
        producer: Producer,
        destination_allowed: Callable[[str], bool],
        partitions_of: Callable[[str], int | None],
    ) -> None:
        self._producer = producer
        self._allowed = destination_allowed
        self._partitions_of = partitions_of

    def destination_of(self, row: dict[str, Any], override: str | None) -> str:
        destination = override or row.get("topic") or row.get("original_topic")
        if not destination:
            raise ReplayRefused(f"dead letter {row['id']} has no topic; name a destination")
        if not self._allowed(destination):
            raise ReplayRefused(f"destination not allowed: {destination!r} is not in the allowlist")
        if self._partitions_of(destination) is None:
            raise ReplayRefused(f"destination topic {destination!r} does not exist")
        return str(destination)

    def replay(
        self,
        rows: Sequence[dict[str, Any]],
        *,
        destination: str | None = None,
        edit: Edit | None = None,
        rate_per_s: float = 500.0,
    ) -> list[int]:
        """Send each row; returns the ids the broker acknowledged. Checks every
        destination before sending anything."""
        targets = [self.destination_of(row, destination) for row in rows]
        acked: list[int] = []
        started = time.monotonic()
        for index, (row, target) in enumerate(zip(rows, targets, strict=True)):
            value, headers = replayed_message(row, edit)

            def done(err: KafkaError | None, msg: Message, row_id: int = row["id"]) -> None:
                if err is None:  # a refused message is left out: its dead letter stays
                    acked.append(row_id)

            produce_patiently(
                self._producer,
                target,
                key=row["msg_key"],
                value=value,
                headers=headers,
                on_delivery=done,
            )
            # Paced between messages only: nothing waits after the last one.
            ahead = (index + 1) / rate_per_s - (time.monotonic() - started)
            if ahead > 0 and index + 1 < len(rows):
                self._producer.poll(ahead)
        self._producer.flush(30)
        return sorted(acked)
