"""A handler's registration: its topic, policy, strategy, and the topics derived from it.

Derived topic names follow the contract (DESIGN section 2):
- `<topic>.retry.<delay>`: the `topics` strategy's tier for one delay (e.g. 5m);
- `<topic>.dlq`: dead letters sent to a topic;
- `<group>.<topic>.retry`: the `service` strategy's per-group destination, so that
  other groups reading `<topic>` do not see this group's retries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from redrive.errors import ConfigError
from redrive.policy import Policy, format_duration

Strategy = Literal["blocking", "pause", "topics", "service"]
STRATEGIES: tuple[Strategy, ...] = ("blocking", "pause", "topics", "service")
DeadLetterTarget = Literal["topic", "service"]
Kind = Literal["source", "tier", "redelivery"]
MAX_TIERS = 30


@dataclass
class Route:
    topic: str
    handler: Callable[..., Any]
    policy: Policy
    strategy: Strategy
    group: str
    value_deserializer: Callable[[bytes], Any] | None = None
    dead_letters: DeadLetterTarget = "topic"
    per_group_topic: bool = False
    tiers: dict[int, str] = field(default_factory=dict)
    """Nominal delay (ms) -> tier topic, for the `topics` strategy."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(
                f"strategy for {self.topic!r}",
                f"{self.strategy!r} is not a strategy",
                f"use one of {', '.join(STRATEGIES)}",
            )
        if self.strategy == "topics":
            self.tiers = {
                delay: tier_topic(self.topic, delay) for delay in _tier_delays(self.policy)
            }

    @property
    def dlq_topic(self) -> str:
        return f"{self.topic}.dlq"

    @property
    def redelivery_topic(self) -> str:
        """Where the retry service delivers this route's retries."""
        return f"{self.group}.{self.topic}.retry" if self.per_group_topic else self.topic

    def tier_for(self, attempt: int) -> str:
        """The tier topic of the retry after failed attempt `attempt`."""
        nominal = self.policy.schedule.delay_ms(attempt, None)
        if nominal is None or nominal not in self.tiers:  # not reachable: tiers cover the schedule
            nominal = max(self.tiers)
        return self.tiers[nominal]

    def tier_delay_ms(self, tier: str) -> int:
        """The nominal delay of one of this route's tier topics: the longest a record
        written there by redrive waits (jitter only shortens delays)."""
        for delay, name in self.tiers.items():
            if name == tier:
                return delay
        raise KeyError(tier)

    def topics(self) -> dict[str, Kind]:
        """Every topic this route reads, and what it is to the route."""
        read: dict[str, Kind] = {self.topic: "source"}
        for tier in self.tiers.values():
            read[tier] = "tier"
        if self.strategy == "service" and self.per_group_topic:
            read[self.redelivery_topic] = "redelivery"
        return read

    def topics_to_create(self) -> list[str]:
        """Derived topics that must exist (created with the source's partition count)."""
        wanted = [t for t, kind in self.topics().items() if kind != "source"]
        if self.dead_letters == "topic":
            wanted.append(self.dlq_topic)
        return wanted


def tier_topic(topic: str, delay_ms: int) -> str:
    return f"{topic}.retry.{format_duration(delay_ms)}"


def _tier_delays(policy: Policy) -> list[int]:
    """The distinct nominal delays a message can wait under this policy."""
    limit = policy.attempt_limit
    delays: list[int] = []
    attempt = 1
    for delay, count in policy.schedule.runs():
        if limit is not None and attempt >= limit:
            break
        if delay not in delays:
            delays.append(delay)
        if count is None:
            break
        attempt += count
    if len(delays) > MAX_TIERS:
        raise ConfigError(
            "policy",
            f"{policy} needs {len(delays)} retry topics (one per distinct delay)",
            f"use at most {MAX_TIERS} distinct delays with the topics strategy, e.g. a cap",
        )
    return delays
