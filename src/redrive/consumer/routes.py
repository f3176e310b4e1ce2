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

What the strategy named by a route does is its :class:`RetryStrategy` object
(``route.plan``, one module each in :mod:`redrive.consumer.strategies`); how its
failures are decided, its :class:`redrive.router.Router` (``route.router``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from redrive.consumer.breaker import Breaker
from redrive.consumer.handlers import is_async_callable
from redrive.consumer.strategies import BY_NAME, DeadLetterTarget, Kind, RetryStrategy
from redrive.errors import ConfigError
from redrive.policy import Policy, PolicyError, policy
from redrive.router import Router
from redrive.topic_names import dead_letter_topic, held_keys_topic, per_group_retry_topic

Strategy = Literal["blocking", "pause", "topics", "retry-topic", "service"]
STRATEGIES: tuple[Strategy, ...] = ("blocking", "pause", "topics", "retry-topic", "service")
__all__ = [
    "STRATEGIES",
    "DeadLetterTarget",
    "HandlerOptions",
    "Kind",
    "Route",
    "Strategy",
    "build_route",
]


class HandlerOptions(TypedDict, total=False):
    """Options of :meth:`App.handler` and :meth:`App.add_handler`."""

    policy: Any
    """A schedule string, a list of delays, or a Policy (default ``"1s, 10s, 1m"``)."""
    strategy: Strategy
    retry_on: type[BaseException] | Iterable[type[BaseException]]
    fatal_on: type[BaseException] | Iterable[type[BaseException]]
    retryable: Callable[[BaseException], bool | None] | None
    max_attempts: int | None
    max_duration: str | float | None
    deadline_from: Literal["first-failure", "record-timestamp"]
    """Where ``max_duration`` is measured from: the first failure (the default), or the
    original record's timestamp (seed 000's "maximum retry duration")."""
    value_deserializer: Callable[[bytes], Any] | None
    dead_letters: DeadLetterTarget | None
    per_group_topic: bool
    ordering: Literal["key"] | None
    """``"key"``: while a record waits for its retry, the later records of its key wait
    behind it, and are handled in order once it is done with (strategy ``service``, see
    :mod:`redrive.consumer.held_keys`; ``topics`` and ``retry-topic`` with
    ``transactional=True``, see :mod:`redrive.consumer.key_lines`). None (the
    default): a key's later records may overtake a record waiting for its retry."""
    breaker: Breaker | None
    """The ``pause`` strategy's circuit breaker (default: ``Breaker()``; see
    :class:`redrive.consumer.breaker.Breaker`); other strategies have none."""


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
    breaker: Breaker | None = None
    """The circuit breaker's settings (the `pause` strategy)."""
    is_async: bool = False
    """The handler is ``async def``: the App awaits it on its event loop."""
    ordering: Literal["key"] | None = None
    """``"key"``: a key's records are handled in order through retries (see HandlerOptions)."""
    plan: RetryStrategy = field(init=False, repr=False, compare=False)
    """What the strategy does (the object behind the name ``strategy``)."""
    router: Router = field(init=False, repr=False, compare=False)
    """Decides this route's failures with its policy, for its group."""

    def __post_init__(self) -> None:
        plan = BY_NAME.get(self.strategy)
        if plan is None:
            raise ConfigError(
                f"strategy for {self.topic!r}",
                f"{self.strategy!r} is not a strategy",
                f"use one of {', '.join(BY_NAME)}",
            )
        self.plan = plan
        self.router = Router(self.policy, self.group)
        plan.prepare(self)

    @property
    def lines_in_tiers(self) -> bool:
        """Key order kept in the tier topics (:mod:`redrive.consumer.key_lines`)."""
        return self.ordering is not None and self.plan.key_order == "tiers"

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
        return {self.topic: "source", **self.plan.topics(self)}

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
    options: HandlerOptions,
    default_policy: str,
) -> Route:
    """The route of ``@app.handler(topic, **options)``; ConfigError for a bad setting."""
    strategy = options.get("strategy", "service")
    per_group_topic = options.get("per_group_topic", False)
    try:
        chosen = _policy(
            options.get("policy", default_policy),
            retry_on=options.get("retry_on", ()),
            fatal_on=options.get("fatal_on", ()),
            retryable=options.get("retryable"),
            max_attempts=options.get("max_attempts"),
            max_duration=options.get("max_duration"),
            deadline_from=options.get("deadline_from"),
        )
    except PolicyError as exc:
        raise ConfigError(f"policy for {topic!r}", str(exc)) from None
    plan = BY_NAME.get(strategy)
    if per_group_topic and plan is not None and not plan.per_group_topic:
        raise ConfigError(
            f"per_group_topic for {topic!r}",
            "only the service strategy delivers to a per-group topic",
        )
    default_target = plan.default_dead_letters if plan is not None else "topic"
    breaker = options.get("breaker")
    if breaker is not None and not isinstance(breaker, Breaker):
        raise ConfigError(
            f"breaker for {topic!r}",
            f"{breaker!r} is not a Breaker",
            'use breaker=Breaker(failures=5, window="30s", open_for="5s")',
        )
    if breaker is not None and plan is not None and plan.default_breaker is None:
        raise ConfigError(
            f"breaker for {topic!r}",
            f"the {strategy} strategy has no circuit breaker",
            "use strategy='pause', or drop breaker=",
        )
    if breaker is None and plan is not None:
        breaker = plan.default_breaker
    ordering = options.get("ordering")
    _check_ordering(topic, ordering, strategy, plan, per_group_topic)
    return Route(
        topic,
        fn,
        chosen,
        strategy,
        group,
        options.get("value_deserializer"),
        options.get("dead_letters") or default_target,
        per_group_topic,
        breaker=breaker,
        is_async=is_async_callable(fn),
        ordering=ordering,
    )


def _check_ordering(
    topic: str,
    ordering: object,
    strategy: str,
    plan: RetryStrategy | None,
    per_group_topic: bool,
) -> None:
    """``ordering="key"`` needs a strategy that keeps each held key's line (the retry
    service, or the tier topics), and the retries back on the partition whose held
    keys the App keeps."""
    setting = f"ordering for {topic!r}"
    if ordering is None:
        return
    if ordering != "key":
        raise ConfigError(setting, f"{ordering!r} is not an ordering", 'use "key", or leave it out')
    if plan is not None and plan.key_order is None:
        raise ConfigError(
            setting,
            f"the {strategy} strategy does not keep key order through retries",
            'use strategy="service", "topics" or "retry-topic"; '
            'strategy="blocking" keeps the whole partition\'s order',
        )
    if per_group_topic:
        raise ConfigError(
            setting,
            "key order needs the retries delivered back to their own partition",
            "drop per_group_topic=True",
        )


def _policy(spec: Any, **options: Any) -> Policy:
    options = {k: v for k, v in options.items() if v not in (None, ())}
    return policy(spec, **options)
