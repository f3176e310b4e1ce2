"""A retry request waiting in the Spark scheduler's state, and how it is kept there.

The scheduler keeps each valid request in its bucket's state as one
:class:`PendingMessage` serialised to JSON bytes (binary parts in base64, headers as
the retry service stores them), several to a state value (:func:`pack`), so that
everything needed to deliver it survives a restart in the checkpoint.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass

from redrive.header_json import headers_as_json, headers_from_json
from redrive.records import PendingRetry
from redrive.spark.output import OutputRecord


@dataclass(frozen=True, slots=True)
class PendingMessage:
    """A valid retry request waiting in state: what to deliver, when, and until when."""

    due_ms: int
    delivery: OutputRecord
    """The message as it goes to its destination: key, partition, headers unchanged."""
    deadline_ms: int | None
    request: tuple[str, int, int]
    """Where the request was read from (topic, partition, offset)."""

    @classmethod
    def of(cls, retry: PendingRetry) -> PendingMessage:
        r = retry.request
        delivery = OutputRecord(
            retry.destination, retry.key, retry.value, retry.headers, retry.partition
        )
        return cls(retry.due_ms, delivery, retry.deadline_ms, (r.topic, r.partition, r.offset))

    def to_bytes(self) -> bytes:
        """JSON, binary parts in base64; headers as the service stores them."""

        def b64(data: bytes | None) -> str | None:
            return None if data is None else base64.b64encode(data).decode()

        message = self.delivery
        return json.dumps(
            {
                "due": self.due_ms,
                "destination": message.topic,
                "partition": message.partition,
                "key": b64(message.key),
                "value": b64(message.value),
                "headers": headers_as_json(message.headers),
                "deadline": self.deadline_ms,
                "request": list(self.request),
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> PendingMessage:
        item = json.loads(data)

        def unb64(text: str | None) -> bytes | None:
            return None if text is None else base64.b64decode(text)

        delivery = OutputRecord(
            item["destination"],
            unb64(item["key"]),
            unb64(item["value"]),
            headers_from_json(item["headers"]),
            item["partition"],
        )
        topic, partition, offset = item["request"]
        return cls(
            int(item["due"]), delivery, item["deadline"], (topic, int(partition), int(offset))
        )


def pack(messages: Iterable[PendingMessage]) -> bytes:
    """Several messages as one state value: their JSON, one per line (JSON text as
    :meth:`PendingMessage.to_bytes` writes it has no line break)."""
    return b"\n".join(message.to_bytes() for message in messages)


def unpack(data: bytes) -> list[PendingMessage]:
    """The messages :func:`pack` packed."""
    return [PendingMessage.from_bytes(line) for line in data.split(b"\n")] if data else []
