"""The strategies: how the waiting for a retry happens, one module each.

- :mod:`~redrive.consumer.strategies.blocking`: retried in place, its partition paused;
- :mod:`~redrive.consumer.strategies.pause`: retried in place, its partition paused,
  and every partition while its circuit breaker is open;
- :mod:`~redrive.consumer.strategies.topics`: through retry topics, one per delay and
  consumer group;
- :mod:`~redrive.consumer.strategies.retry_topic`: through one retry topic per topic
  and consumer group (seed 000);
- :mod:`~redrive.consumer.strategies.service`: through the retry service.

Each implements :class:`~redrive.consumer.strategies.base.RetryStrategy`. A new
strategy is a new module here and one entry in :data:`BY_NAME`.
"""

from __future__ import annotations

from redrive.consumer.strategies.base import DeadLetterTarget, Kind, RetryStrategy, Wait
from redrive.consumer.strategies.blocking import Blocking
from redrive.consumer.strategies.pause import Pause
from redrive.consumer.strategies.retry_topic import RetryTopic
from redrive.consumer.strategies.service import Service
from redrive.consumer.strategies.topics import Topics

BY_NAME: dict[str, RetryStrategy] = {
    s.name: s for s in (Blocking(), Pause(), Topics(), RetryTopic(), Service())
}
"""Every strategy by the name ``@app.handler(topic, strategy=...)`` takes."""

__all__ = ["BY_NAME", "DeadLetterTarget", "Kind", "RetryStrategy", "Wait"]
