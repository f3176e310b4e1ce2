"""redrive: failed Kafka messages come back when due; spent ones land in dead letters."""

from redrive.consumer import App, BatchFailed, Breaker, DeserializationError, Message
from redrive.policy import FatalError, Policy, RetryableError, policy

__version__ = "0.1.0"

__all__ = [
    "App",
    "BatchFailed",
    "Breaker",
    "DeserializationError",
    "FatalError",
    "Message",
    "Policy",
    "RetryableError",
    "__version__",
    "policy",
]
