"""The strategies: how the waiting for a retry happens, one module each.

- :mod:`~redrive.consumer.strategies.blocking`: retried in place, its partition paused;
- :mod:`~redrive.consumer.strategies.pause`: retried in place, its partition paused,
  and every partition while its circuit breaker is open;
- :mod:`~redrive.consumer.strategies.topics`: through retry topics, one per delay and
  consumer group;
- :mod:`~redrive.consumer.strategies.retry_topic`: through one retry topic per topic
  and consumer group, whatever the delay;
- :mod:`~redrive.consumer.strategies.service`: through the retry service.

Each implements :class:`~redrive.consumer.strategies.base.RetryStrategy` as a value
carrying its own options (``Pause(breaker=...)``, ``Service(ordering="key")``). A new
strategy is a new module here and one entry in :data:`BY_NAME`.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from redrive.consumer.strategies.base import (
    DeadLetterTarget,
    Kind,
    Ordering,
    RetryStrategy,
    Wait,
)
from redrive.consumer.strategies.blocking import Blocking
from redrive.consumer.strategies.pause import Pause
from redrive.consumer.strategies.retry_topic import RetryTopic
from redrive.consumer.strategies.service import Service
from redrive.consumer.strategies.topics import Topics

StrategyName: TypeAlias = Literal["blocking", "pause", "topics", "retry-topic", "service"]
"""The shorthands: each strategy with its default options."""
Strategy: TypeAlias = Blocking | Pause | Topics | RetryTopic | Service | StrategyName
"""What ``@app.handler(topic, strategy=...)`` takes."""
BatchStrategy: TypeAlias = (
    Topics | RetryTopic | Service | Literal["topics", "retry-topic", "service"]
)
"""What ``@app.batch_handler(topic, strategy=...)`` takes: not those retrying in place
(a failed record of a batch would hold back every later record of its partition)."""

BY_NAME: dict[str, type[RetryStrategy]] = {
    s.name: s for s in (Blocking, Pause, Topics, RetryTopic, Service)
}
"""Every strategy by its shorthand."""

__all__ = [
    "BY_NAME",
    "BatchStrategy",
    "Blocking",
    "DeadLetterTarget",
    "Kind",
    "Ordering",
    "Pause",
    "RetryStrategy",
    "RetryTopic",
    "Service",
    "Strategy",
    "StrategyName",
    "Topics",
    "Wait",
]
