"""redrive on Kafka share groups (KIP-932): :class:`ShareApp`."""

from redrive.consumer.share.app import ShareApp, ShareHandlerOptions

__all__ = ["ShareApp", "ShareHandlerOptions"]
