"""``topics``: non-blocking, Kafka only, with a retry topic per delay.

A failed record is written to the tier topic of its delay,
``<group>.<topic>.retry.<delay>`` (``billing.orders.retry.5m``), on the partition it
came from (a tier has its source's partition count). Tiers are per consumer group:
another group reading ``<topic>`` with this strategy has tiers of its own, and never
sees this group's retries. The App reads the tiers too; a tier record not due yet holds its
partition (sought back and paused, no sleep) until it is, then it is handled again.
A tier record claiming to be due later than its tier's delay allows (a forged or
corrupt ``redrive-retry-at``) would hold the partition for ever: it is handled now.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import structlog

from redrive.clock import now_ms
from redrive.consumer.strategies.base import (
    Kind,
    Ordering,
    RetryStrategy,
    RouteView,
    Wait,
    check_ordering,
    check_retry_topic,
)
from redrive.errors import ConfigError
from redrive.headers import RetryHeaders
from redrive.policy import Policy, format_duration
from redrive.router import FailedRecord, RetryTarget
from redrive.topic_names import tier_topic

log = structlog.get_logger("redrive.consumer")

MAX_TIERS = 30
TIER_CLOCK_SLACK_MS = 60_000
"""How much later than its tier's delay a tier record may be due and still be waited
for: room for clocks of app instances that disagree. Anything later is forged or
corrupt, and is handled at once rather than holding its partition for ever."""


@dataclass(frozen=True)
class Topics(RetryStrategy):
    """Through retry topics, one per delay and consumer group. ``ordering="key"``: a
    key's later records wait behind its record waiting in a tier (see
    :mod:`redrive.consumer.key_lines`; the App must be transactional)."""

    name = "topics"
    key_order = "tiers"

    ordering: Ordering = None

    def __post_init__(self) -> None:
        check_ordering(type(self).__name__, self.ordering)

    tier_pattern: ClassVar[str] = "<group>.<topic>.retry.<delay>"
    """How a tier's name is made, for the error about a group that cannot make one."""

    def prepare(self, route: RouteView) -> None:
        route.tiers = self.tier_topics(route)
        what = f"the {self.name} strategy's retry topic"
        for name in route.tiers.values():
            check_retry_topic(name, what, self.tier_pattern, "another strategy")

    def tier_topics(self, route: RouteView) -> dict[int, str]:
        """The route's tiers: nominal delay (ms) -> tier topic, one per distinct delay."""
        return {
            delay: tier_topic(route.group, route.topic, format_duration(delay))
            for delay in tier_delays(route.policy)
        }

    def topics(self, route: RouteView) -> dict[str, Kind]:
        return dict.fromkeys(route.tiers.values(), "tier")

    def wait_until_due(
        self, route: RouteView, topic: str, partition: int, offset: int, delivery: RetryHeaders
    ) -> Wait | None:
        now = now_ms()
        if delivery.retry_at <= now:
            return None
        if delivery.retry_at - now <= route.tier_delay_ms(topic) + TIER_CLOCK_SLACK_MS:
            return Wait(delivery.retry_at)
        log.warning(
            "tier record due later than its tier's delay allows; handled now",
            topic=topic,
            partition=partition,
            offset=offset,
            retry_at=delivery.retry_at,
        )
        return None

    def retry_to(
        self, route: RouteView, record: FailedRecord, requests_topic: str
    ) -> RetryTarget | None:
        # The tier is read by this App, not delivered by the service: the request
        # names the route's topic and no partition; the record keeps its partition.
        return RetryTarget(route.tier_for(record.attempt), route.topic, record.partition)


def nominal_delays(policy: Policy) -> Iterator[int]:
    """The distinct nominal delays a message can wait under this policy, in the order
    the schedule first reaches them (none past the policy's attempt limit)."""
    limit = policy.attempt_limit
    seen: set[int] = set()
    attempt = 1
    for delay, count in policy.schedule.runs():
        if limit is not None and attempt >= limit:
            return
        if delay not in seen:
            seen.add(delay)
            yield delay
        if count is None:
            return
        attempt += count


def tier_delays(policy: Policy) -> list[int]:
    """The distinct nominal delays a message can wait under this policy: one tier each,
    at most :data:`MAX_TIERS`."""
    delays = list(nominal_delays(policy))
    if len(delays) > MAX_TIERS:
        raise ConfigError(
            "policy",
            f"{policy} needs {len(delays)} retry topics (one per distinct delay)",
            f"use at most {MAX_TIERS} distinct delays with the topics strategy, e.g. a cap",
        )
    return delays
