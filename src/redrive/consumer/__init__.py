"""The consumer library: one policy model, five strategies as values."""

from redrive.consumer.app import (
    App,
    DeserializationError,
    UnprocessableRecordError,
    UnreadableHeadersError,
)
from redrive.consumer.brake import DeadLetterBrake
from redrive.consumer.breaker import Breaker, BreakerState
from redrive.consumer.errors import BatchFailed, InvalidBatchFailureError, RefusedReturnError
from redrive.consumer.handlers import AsyncHandlerError
from redrive.consumer.message import Message
from redrive.consumer.refusals import RefuseAndCount, RefuseToDeadLetters, ReturnRule
from redrive.consumer.share import ShareApp
from redrive.consumer.strategies import Blocking, Pause, RetryTopic, Service, Topics

__all__ = [
    "App",
    "AsyncHandlerError",
    "BatchFailed",
    "Blocking",
    "Breaker",
    "BreakerState",
    "DeadLetterBrake",
    "DeserializationError",
    "InvalidBatchFailureError",
    "Message",
    "Pause",
    "RefuseAndCount",
    "RefuseToDeadLetters",
    "RefusedReturnError",
    "RetryTopic",
    "ReturnRule",
    "Service",
    "ShareApp",
    "Topics",
    "UnprocessableRecordError",
    "UnreadableHeadersError",
]
