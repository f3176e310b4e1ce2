"""What ``redrive spark pipeline`` was asked to run: its settings as given, the broker
it talks to, and the settings once checked (:mod:`redrive.spark.pipeline_checks`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from redrive.policy import Policy
from redrive.signing import KeyRing
from redrive.spark.record_handler import DeadLetterTarget, Handler
from redrive.spark.supervision import Restarts
from redrive.topic_names import REQUESTS_TOPIC


@dataclass(frozen=True)
class Broker:
    """Where the pipeline reads and writes: the bootstrap servers, and librdkafka
    settings (security...) for the topic checks, given to Spark's Kafka clients as
    ``kafka.<name>`` options."""

    bootstrap: str
    client_config: Mapping[str, str] = field(default_factory=dict)


BrokerResolver = Callable[[str | None], Broker]
"""The broker for the ``--bootstrap`` option's value (None when not given)."""


class DeliveryName(StrEnum):
    """``--delivery``: how outputs are written (:mod:`redrive.spark.delivery`)."""

    exactly_once = "exactly-once"
    at_least_once = "at-least-once"


class DeadLetters(StrEnum):
    """``--dead-letters``: the pipeline's ``dead_letters`` (Typer takes enums, not
    Literal types)."""

    service = "service"
    topic = "topic"


@dataclass(frozen=True)
class PipelineSettings:
    """What the command was asked to run, as given."""

    handler: str
    sources: tuple[str, ...]
    output: str
    group: str
    policy: str
    checkpoint: str
    retry_on: tuple[str, ...] = ()
    fatal_on: tuple[str, ...] = ()
    requests_topic: str = REQUESTS_TOPIC
    dead_letters: DeadLetterTarget = "service"
    dlq_topic: str | None = None
    per_group_topic: bool = False
    trigger: str = "1 second"
    starting_offsets: str = "earliest"
    delivery: DeliveryName = DeliveryName.exactly_once
    max_offsets_per_trigger: int | None = None
    spark_conf: tuple[str, ...] = ()
    """``--conf key=value``, as given."""
    kafka: tuple[str, ...] = ()
    """``--kafka key=value`` (librdkafka's names), as given."""
    metrics_port: int | None = None
    restarts: int = Restarts.at_most
    """``--restarts``: times a failed query is started again within ten minutes."""
    signing_keys: tuple[str, ...] = ()
    """``--signing-key id=secret``, as given."""
    signing_key_files: tuple[str, ...] = ()
    """``--signing-key-file PATH``, as given."""


@dataclass(frozen=True)
class CheckedPipeline:
    """Settings that passed every check made without Spark, with what they name."""

    settings: PipelineSettings
    handler: Handler
    policy: Policy
    broker: Broker
    master: str | None
    """None: spark-submit's session."""
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    kafka_options: Mapping[str, str] = field(default_factory=dict)
    """The broker's client settings as Spark's Java client takes them."""
    signing: KeyRing | None = None
    """The keys its requests are signed with: the options', else the environment's."""
    restarts: Restarts = field(default_factory=Restarts)
