"""An App's settings, checked once when the App is made, as one value.

What a run needs of the App besides its routes (:mod:`redrive.consumer.session`
takes this, not the App): Kafka's settings merged once, how the loop polls and
commits, the hooks. Frozen: a running session never sees them change.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from redrive.consumer.clients import chosen_partitioner
from redrive.consumer.message import Message
from redrive.consumer.refusals import DEFAULT_RULE, SETTING, ReturnRule, checked_rule
from redrive.consumer.repeats import checked_window
from redrive.consumer.strategies.pause import BreakerHook
from redrive.membership import static_membership
from redrive.partitioners import Partitioner, PartitionerName
from redrive.policy import DeadLetter, Retry
from redrive.signing import KeyRing
from redrive.topic_names import REQUESTS_TOPIC

RetryHook = Callable[[Message, Retry, BaseException], None]
DeadLetterHook = Callable[[Message | None, DeadLetter, BaseException], None]


@dataclass(frozen=True, slots=True)
class Hooks:
    """The user's callbacks on each decision (a hook that raises is logged)."""

    on_retry: RetryHook | None = None
    on_dead_letter: DeadLetterHook | None = None
    on_breaker: BreakerHook | None = None


@dataclass(frozen=True, slots=True)
class Polling:
    """How the loop turns: records per poll, the longest wait of a poll, how often
    offsets are committed, and the bound of async records in flight."""

    max_poll_records: int
    poll_timeout_s: float
    commit_interval_s: float
    max_in_flight: int


@dataclass(frozen=True, slots=True)
class AppSettings:
    bootstrap: str
    group: str
    kafka: Mapping[str, Any]
    """librdkafka settings of the consumer and the producer alike."""
    consumer_kafka: Mapping[str, Any]
    """librdkafka settings of the consumer only (static membership included)."""
    instance_id: str | None
    requests_topic: str
    partitioner: Partitioner
    transactional: bool
    repeat_window: int
    polling: Polling
    hooks: Hooks
    signing: KeyRing | None = None
    """The keys the App signs what it writes with, and verifies the returns it reads
    with; None: unsigned, and returns believed where they name the topic read."""
    returns: ReturnRule = DEFAULT_RULE
    """What becomes of a return the App cannot believe (:mod:`redrive.consumer.refusals`)."""
    consumer_config: Mapping[str, Any] = field(init=False)
    """The consumer's settings as librdkafka gets them (``kafka`` then ``consumer_kafka``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "consumer_config", {**self.kafka, **self.consumer_kafka})

    @property
    def unsigned_returns(self) -> bool:
        """Whether an unsigned return may be believed (no keys, or trusted while signing
        is rolled out): the repeat window then binds each id to its record's content
        (:mod:`redrive.consumer.repeats`)."""
        return self.signing is None or self.returns.trust_unsigned

    @classmethod
    def of(
        cls,
        bootstrap: str | None,
        group: str,
        *,
        kafka: Mapping[str, Any] | None,
        consumer_kafka: Mapping[str, Any] | None,
        instance_id: str | None,
        requests_topic: str | None,
        partitioner: Partitioner | PartitionerName,
        transactional: bool,
        repeat_window: int,
        polling: Polling,
        hooks: Hooks,
        signing: KeyRing | None = None,
        returns: ReturnRule = DEFAULT_RULE,
        returns_setting: str = SETTING,
    ) -> AppSettings:
        """The settings as a consumer's keyword arguments give them: the bootstrap
        servers, requests topic and signing keys from the environment unless given
        (REDRIVE_BOOTSTRAP, REDRIVE_REQUESTS_TOPIC, REDRIVE_SIGNING_KEYS and
        REDRIVE_SIGNING_KEY_FILES), each value checked (a ConfigError naming the
        setting; ``returns_setting`` names ``returns`` for the consumer at hand)."""
        kafka = dict(kafka or {})
        if signing is None:
            signing = KeyRing.from_environment(os.environ)
        return cls(
            bootstrap=bootstrap or os.environ.get("REDRIVE_BOOTSTRAP", "localhost:9092"),
            group=group,
            kafka=kafka,
            consumer_kafka={**static_membership(instance_id), **(consumer_kafka or {})},
            instance_id=instance_id,
            requests_topic=requests_topic
            or os.environ.get("REDRIVE_REQUESTS_TOPIC", REQUESTS_TOPIC),
            partitioner=chosen_partitioner(partitioner, kafka),
            transactional=transactional,
            repeat_window=checked_window(repeat_window),
            polling=polling,
            hooks=hooks,
            signing=signing,
            returns=checked_rule(returns, signing, returns_setting),
        )
