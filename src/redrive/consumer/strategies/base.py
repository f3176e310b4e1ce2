"""The interface every strategy implements: how the waiting for a retry happens.

The App's loop, offsets, commits and rebalances are the same for every strategy, and
what a failure becomes (a retry or a dead letter, and their headers) is the failure
router's decision (:mod:`redrive.router`). A strategy says only the rest:

- which topics a route reads besides its own (:meth:`RetryStrategy.topics`), derived
  from the route when it is registered (:meth:`RetryStrategy.prepare`);
- whether a record that arrived with redrive headers must wait before it is handled
  (:meth:`RetryStrategy.hold`: a tier record that is not due yet);
- where a retry goes (:meth:`RetryStrategy.retry_to`: a topic, or None to retry the
  record in place), and how the loop waits for a retry in place
  (:meth:`RetryStrategy.wait`).

A new strategy is a subclass in a module of its own (a frozen dataclass of its own
options), registered by name in :data:`redrive.consumer.strategies.BY_NAME`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol, TypeAlias

from redrive.consumer.breaker import Breaker
from redrive.errors import ConfigError
from redrive.headers import MAX_TOPIC_LENGTH, RetryHeaders, is_topic_name
from redrive.policy import Policy, Retry
from redrive.router import FailedRecord, RetryTarget

DeadLetterTarget: TypeAlias = Literal["topic", "service"]
Kind: TypeAlias = Literal["source", "tier", "redelivery"]
"""What a topic a route reads is to it: its own, a retry tier, or a per-group topic."""
KeyOrder: TypeAlias = Literal["service", "tiers"]
"""Where a strategy keeps the line of a key held by ``ordering="key"``."""
Ordering: TypeAlias = Literal["key"] | None
"""``"key"``: a key's records are handled in order through retries; None: a key's
later records may overtake a record waiting for its retry."""


def check_retry_topic(name: str, what: str, pattern: str, otherwise: str) -> None:
    """A ConfigError unless a retry topic a strategy derives from the group and the
    topic (``what`` it is, named by ``pattern``) is a legal Kafka topic name."""
    if not is_topic_name(name):
        raise ConfigError(
            "group",
            f"{what} {name!r} ({pattern}) is not a legal Kafka topic name",
            f"use a group id of a-z A-Z 0-9 . _ - short enough for a "
            f"{MAX_TOPIC_LENGTH}-character topic name, or {otherwise}",
        )


class RouteView(Protocol):
    """What a strategy sees of a handler's route (:class:`redrive.consumer.routes.Route`)."""

    topic: str
    group: str
    policy: Policy
    tiers: dict[int, str]

    @property
    def redelivery_topic(self) -> str: ...

    def tier_for(self, attempt: int) -> str: ...

    def tier_delay_ms(self, tier: str) -> int: ...


@dataclass(frozen=True, slots=True)
class Wait:
    """The record's partition (with ``all_partitions``, every assigned partition) waits
    until ``until_ms``, then the record is handled again."""

    until_ms: int
    all_partitions: bool = False
    all_until_ms: int | None = None
    """With ``all_partitions``: when the other partitions may go on (None: ``until_ms``);
    the pause strategy's breaker, while the record itself waits for its own retry."""
    dealt_with: bool = False
    """The record itself is dealt with (dead-lettered by a failure that opened the
    breaker): its partition waits from the next record on."""


class RetryStrategy(ABC):
    """How the waiting for a retry happens (see the module).

    A strategy is a value: each subclass is a frozen dataclass carrying only the
    options that mean something to it, so that ``Blocking(ordering="key")`` or
    ``Topics(breaker=...)`` cannot be written. The options other strategies do not
    have read as their neutral value here."""

    name: ClassVar[str]
    """The shorthand ``@app.handler(topic, strategy=...)`` takes for the default value."""
    default_dead_letters: ClassVar[DeadLetterTarget] = "topic"
    """Where dead letters go unless the handler says (``dead_letters=``)."""
    in_place: ClassVar[bool] = False
    """Whether a failed record is retried in place, its partition waiting: order is
    kept per partition, so an async handler takes one record of a partition at a time
    (otherwise one record of a key at a time)."""
    key_order: ClassVar[KeyOrder | None] = None
    """Where each held key's line is kept with ``ordering="key"``: in the retry
    service (:mod:`redrive.service.store.key_queues`) or in the tier topics
    (:mod:`redrive.consumer.key_lines`); None: the strategy does not keep key order."""

    @property
    def ordering(self) -> Ordering:
        """``"key"``: a key's later records wait behind its record waiting for a retry."""
        return None

    @property
    def retries_per_group(self) -> bool:
        """Retries come back on ``<group>.<topic>.retry`` rather than ``<topic>``."""
        return False

    @property
    def breaker(self) -> Breaker | None:
        """The circuit breaker's settings; None: the strategy has none."""
        return None

    def prepare(self, route: RouteView) -> None:  # noqa: B027 - most strategies derive nothing
        """Derive what the strategy needs from a route being registered (raise
        :class:`redrive.errors.ConfigError` for a route it cannot serve)."""

    def topics(self, route: RouteView) -> dict[str, Kind]:
        """The topics the route reads besides its own."""
        return {}

    def wait_until_due(
        self, route: RouteView, topic: str, partition: int, offset: int, delivery: RetryHeaders
    ) -> Wait | None:
        """Whether a record read from one of the strategy's own topics (:meth:`topics`)
        with this group's redrive headers waits before it is handled (None: now)."""
        return None

    @abstractmethod
    def retry_to(
        self, route: RouteView, record: FailedRecord, requests_topic: str
    ) -> RetryTarget | None:
        """Where the retry of a failed record goes; None: it is retried in place."""

    def wait(self, retry: Retry) -> Wait | None:
        """How the loop waits for a retry in place (None for a retry handed off)."""
        return None


def check_ordering(strategy: str, ordering: object) -> None:
    """A ConfigError unless ``ordering`` is one (for callers mypy does not check)."""
    if ordering not in (None, "key"):
        raise ConfigError(
            f"{strategy}(ordering=...)", f"{ordering!r} is not an ordering", 'use "key", or None'
        )
