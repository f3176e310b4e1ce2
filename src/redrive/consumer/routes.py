"""A handler's registration: its topic, policy, strategy, and the topics derived from it.

Derived topic names follow the contract (the header contract's topic names):
- `<group>.<topic>.retry.<delay>`: the `topics` strategy's tier for one delay (e.g.
  5m), per group as the next one;
- `<group>.<topic>.retry.all`: the `retry-topic` strategy's one retry topic, per group
  as the tiers;
- `<topic>.dlq`: dead letters sent to a topic;
- `<group>.<topic>.retry`: the `service` strategy's per-group destination, so that
  other groups reading `<topic>` do not see this group's retries;
- `<group>.<topic>.held`: with ``ordering="key"``, the keys waiting in the retry
  service (compacted; :mod:`redrive.consumer.held_keys`).

What a route's strategy does, with the options it carries, is its
:class:`RetryStrategy` value (``route.strategy``, one module each in
:mod:`redrive.consumer.strategies`); how its failures are decided, its
:class:`redrive.router.Router` (``route.router``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from redrive.consumer.brake import DeadLetterBrake
from redrive.consumer.breaker import Breaker
from redrive.consumer.handlers import is_async_callable
from redrive.consumer.strategies import (
    BY_NAME,
    BatchStrategy,
    DeadLetterTarget,
    Kind,
    Ordering,
    RetryStrategy,
    Strategy,
    StrategyName,
)
from redrive.errors import ConfigError
from redrive.policy import Policy, PolicyError, PolicyOptions, policy_among
from redrive.router import Router
from redrive.topic_names import dead_letter_topic, held_keys_topic, per_group_retry_topic

STRATEGIES: tuple[StrategyName, ...] = ("blocking", "pause", "topics", "retry-topic", "service")
__all__ = [
    "STRATEGIES",
    "BatchHandlerOptions",
    "DeadLetterTarget",
    "HandlerOptions",
    "Kind",
    "Route",
    "Strategy",
    "build_route",
    "strategy_value",
]


class RouteOptions(PolicyOptions, total=False):
    """What every handler takes: the policy's options (:class:`PolicyOptions`, as
    :func:`redrive.policy` and the Spark pipeline take them), and the rest."""

    policy: Any
    """A schedule string, a list of delays, or a Policy (default ``"1s, 10s, 1m"``)."""
    value_deserializer: Callable[[bytes], Any] | None
    dead_letters: DeadLetterTarget | None


class HandlerOptions(RouteOptions, total=False):
    """Options of :meth:`App.handler` and :meth:`App.add_handler`."""

    strategy: Strategy
    """A strategy value (``Service(ordering="key")``, ``Pause(breaker=...)``...) or its
    shorthand (``"service"``: ``Service()``); default ``Service()``."""
    dead_letter_brake: DeadLetterBrake | None
    """Stop handling the route for a while when its dead letters surge
    (:mod:`redrive.consumer.brakes`); default None: no brake."""


class BatchHandlerOptions(RouteOptions, total=False):
    """Options of :meth:`App.batch_handler`: no strategy retrying in place."""

    strategy: BatchStrategy


MOVED: Mapping[str, str] = {
    "breaker": "strategy=Pause(breaker=...)",
    "per_group_topic": "strategy=Service(per_group_topic=True)",
    "ordering": 'strategy=Service(ordering="key") (or Topics, RetryTopic)',
}
"""Handler options that became options of the one strategy they mean something to."""


@dataclass
class Route:
    topic: str
    handler: Callable[..., Any]
    policy: Policy
    strategy: RetryStrategy
    """What the strategy does, with its options."""
    group: str
    value_deserializer: Callable[[bytes], Any] | None = None
    dead_letters: DeadLetterTarget = "topic"
    tiers: dict[int, str] = field(default_factory=dict)
    """Nominal delay (ms) -> tier topic, for the `topics` strategy."""
    is_async: bool = False
    """The handler is ``async def``: the App awaits it on its event loop."""
    dead_letter_brake: DeadLetterBrake | None = None
    """When its dead letters surge, the route stops for a while (:mod:`redrive.consumer.brakes`)."""
    router: Router = field(init=False, repr=False, compare=False)
    """Decides this route's failures with its policy, for its group."""
    # The strategy's options, read on every record: plain attributes, set once.
    ordering: Ordering = field(init=False, repr=False, compare=False)
    """``"key"``: a key's records are handled in order through retries."""
    per_group_topic: bool = field(init=False, repr=False, compare=False)
    breaker: Breaker | None = field(init=False, repr=False, compare=False)
    """The circuit breaker's settings (the `pause` strategy)."""

    def __post_init__(self) -> None:
        self.router = Router(self.policy, self.group)
        self.ordering = self.strategy.ordering
        self.per_group_topic = self.strategy.retries_per_group
        self.breaker = self.strategy.breaker
        self.strategy.prepare(self)

    @property
    def lines_in_tiers(self) -> bool:
        """Key order kept in the tier topics (:mod:`redrive.consumer.key_lines`)."""
        return self.ordering is not None and self.strategy.key_order == "tiers"

    @property
    def held_topic(self) -> str:
        """Where the keys waiting in the retry service are written (``ordering="key"``)."""
        return held_keys_topic(self.group, self.topic)

    @property
    def dlq_topic(self) -> str:
        return dead_letter_topic(self.topic)

    @property
    def redelivery_topic(self) -> str:
        """Where the retry service delivers this route's retries."""
        if self.per_group_topic:
            return per_group_retry_topic(self.group, self.topic)
        return self.topic

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
        return {self.topic: "source", **self.strategy.topics(self)}

    def topics_to_create(self) -> list[str]:
        """Derived topics that must exist (created with the source's partition count)."""
        wanted = [t for t, kind in self.topics().items() if kind != "source"]
        if self.dead_letters == "topic":
            wanted.append(self.dlq_topic)
        if self.ordering == "key":
            wanted.append(self.held_topic)
        return wanted


def build_route(
    topic: str,
    fn: Callable[..., Any],
    group: str,
    options: HandlerOptions | BatchHandlerOptions,
    default_policy: str,
) -> Route:
    """The route of ``@app.handler(topic, **options)``; ConfigError for a bad setting."""
    check_options(options)
    strategy = strategy_value(topic, options.get("strategy", "service"))
    try:
        chosen = policy_among(options.get("policy", default_policy), options)
    except PolicyError as exc:
        raise ConfigError(f"policy for {topic!r}", str(exc)) from None
    return Route(
        topic,
        fn,
        chosen,
        strategy,
        group,
        options.get("value_deserializer"),
        options.get("dead_letters") or strategy.default_dead_letters,
        is_async=is_async_callable(fn),
        dead_letter_brake=brake_value(topic, options.get("dead_letter_brake")),
    )


def brake_value(topic: str, brake: object) -> DeadLetterBrake | None:
    """The dead-letter brake a handler names, checked (for callers mypy does not check)."""
    if brake is None or isinstance(brake, DeadLetterBrake):
        return brake
    raise ConfigError(
        f"dead_letter_brake for {topic!r}",
        f"{brake!r} is not a DeadLetterBrake",
        'use DeadLetterBrake(dead_letters=100, window="1m"), or None',
    )


def check_options(options: Mapping[str, object]) -> None:
    """For callers mypy does not check: an option moved into a strategy value is a
    ConfigError saying where it went, any other unknown one a TypeError."""
    for name in options:
        if name in MOVED:
            raise ConfigError(
                name, "is an option of the strategy it belongs to", f"use {MOVED[name]}"
            )
    known = HandlerOptions.__optional_keys__
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"unknown handler option(s) {unknown}; see HandlerOptions")


def strategy_value(topic: str, spec: object) -> RetryStrategy:
    """The strategy a handler names: a value as given, a shorthand with its defaults."""
    if isinstance(spec, RetryStrategy):
        return spec
    if isinstance(spec, str) and spec in BY_NAME:
        return BY_NAME[spec]()
    raise ConfigError(
        f"strategy for {topic!r}",
        f"{spec!r} is not a strategy",
        f'use one of {", ".join(BY_NAME)}, or a value such as Service(ordering="key")',
    )
