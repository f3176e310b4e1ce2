"""Whether an App's loop is healthy: what its ``/healthz`` answers.

Healthy means both:

- the loop runs: :meth:`redrive.App.run` subscribed and entered its loop, which has
  neither returned nor raised, and no stop was asked for (so 503 from
  :meth:`redrive.App.stop` or a signal on, while the App commits and leaves its group);
- it polls: its last poll began less than ``max.poll.interval.ms`` ago (librdkafka's
  300 s unless set), the time after which Kafka itself takes a member for dead: a
  handler that hangs makes the App unhealthy.

How many partitions are assigned is reported, not judged: an App with none (more
instances than partitions, or during a rebalance) is healthy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from redrive.consumer.metrics_server import Health

MAX_POLL_INTERVAL_MS = 300_000
"""librdkafka's default: a member that does not poll for this long leaves its group."""


def max_poll_interval_ms(consumer_settings: Mapping[str, Any]) -> float:
    setting = consumer_settings.get("max.poll.interval.ms")
    try:
        return float(setting) if setting is not None else MAX_POLL_INTERVAL_MS
    except (TypeError, ValueError):
        return MAX_POLL_INTERVAL_MS  # the consumer refused it at start-up anyway


def loop_health(
    *,
    group: str,
    assigned: int,
    looping: bool,
    loop_error: str | None,
    stopping: bool,
    last_turn: float | None,
    now: float,
    limit_ms: float,
) -> Health:
    """The loop's health (see the module); ``last_turn`` and ``now`` are
    ``time.monotonic()`` readings: when the loop last began a poll, and now."""
    detail: dict[str, object] = {"group": group, "assigned_partitions": assigned}
    if not looping:
        if loop_error is not None:
            reason = f"loop failed: {loop_error}"
        else:
            reason = "starting" if last_turn is None else "stopped"
        return Health(False, {**detail, "reason": reason})
    if stopping:
        return Health(False, {**detail, "reason": "stopping"})
    assert last_turn is not None
    since = now - last_turn
    detail["seconds_since_poll"] = round(since, 3)
    if since * 1000 > limit_ms:
        reason = f"stalled: no poll for {since:.1f} s, max.poll.interval.ms is {limit_ms:.0f}"
        return Health(False, {**detail, "reason": reason})
    return Health(True, detail)
