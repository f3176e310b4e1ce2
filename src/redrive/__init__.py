"""redrive: failed Kafka messages come back when due; spent ones land in dead letters."""

from redrive.consumer import (
    App,
    BatchFailed,
    Blocking,
    Breaker,
    DeadLetterBrake,
    DeserializationError,
    Message,
    Pause,
    RefuseAndCount,
    RefuseToDeadLetters,
    RetryTopic,
    Service,
    ShareApp,
    Topics,
)
from redrive.policy import FatalError, Policy, RetryableError, policy
from redrive.signing import KeyRing

__version__ = "0.1.0"

__all__ = [
    "App",
    "BatchFailed",
    "Blocking",
    "Breaker",
    "DeadLetterBrake",
    "DeserializationError",
    "FatalError",
    "KeyRing",
    "Message",
    "Pause",
    "Policy",
    "RefuseAndCount",
    "RefuseToDeadLetters",
    "RetryTopic",
    "RetryableError",
    "Service",
    "ShareApp",
    "Topics",
    "__version__",
    "policy",
]
