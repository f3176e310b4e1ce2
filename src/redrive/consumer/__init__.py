"""The consumer library: one policy model, four strategies."""

from redrive.consumer.app import App, DeserializationError
from redrive.consumer.message import Message

__all__ = ["App", "DeserializationError", "Message"]
