"""The consumer library: one policy model, four strategies."""

from redrive.consumer.app import (
    App,
    DeserializationError,
    UnprocessableRecordError,
    UnreadableHeadersError,
)
from redrive.consumer.handlers import AsyncHandlerError
from redrive.consumer.message import Message

__all__ = [
    "App",
    "AsyncHandlerError",
    "DeserializationError",
    "Message",
    "UnprocessableRecordError",
    "UnreadableHeadersError",
]
