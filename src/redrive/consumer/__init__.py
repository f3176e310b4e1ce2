"""The consumer library: one policy model, four strategies."""

from redrive.consumer.app import (
    App,
    DeserializationError,
    UnprocessableRecordError,
    UnreadableHeadersError,
)
from redrive.consumer.breaker import Breaker, BreakerState
from redrive.consumer.errors import BatchFailed, InvalidBatchFailureError
from redrive.consumer.handlers import AsyncHandlerError
from redrive.consumer.message import Message

__all__ = [
    "App",
    "AsyncHandlerError",
    "BatchFailed",
    "Breaker",
    "BreakerState",
    "DeserializationError",
    "InvalidBatchFailureError",
    "Message",
    "UnprocessableRecordError",
    "UnreadableHeadersError",
]
