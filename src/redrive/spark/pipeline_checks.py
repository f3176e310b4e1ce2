"""The checks ``redrive spark pipeline`` makes before Spark starts, each a ConfigError
naming the option: the policy and exception classes, the topic names, the group, and
that every topic the query reads or writes exists on the broker."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from redrive.errors import ConfigError
from redrive.headers import MAX_TOPIC_LENGTH, is_topic_name
from redrive.policy import Policy, PolicyError
from redrive.policy import policy as make_policy
from redrive.signing import KeyRing, key_ring
from redrive.spark.handler_import import import_exception_classes
from redrive.spark.record_handler import Destinations
from redrive.spark.supervision import Restarts

if TYPE_CHECKING:
    from redrive.spark.pipeline_settings import Broker, PipelineSettings


def policy(settings: PipelineSettings) -> Policy:
    retry_on = import_exception_classes("--retry-on", settings.retry_on)
    fatal_on = import_exception_classes("--fatal-on", settings.fatal_on)
    try:
        schedule = make_policy(settings.policy)
    except PolicyError as exc:
        raise ConfigError(
            "--policy",
            str(exc),
            'e.g. "5s x3, 1m x2"; redrive policy explain "..." shows the timeline',
        ) from None
    try:
        return make_policy(schedule, retry_on=retry_on, fatal_on=fatal_on)
    except PolicyError as exc:
        raise ConfigError("--retry-on/--fatal-on", str(exc)) from None


def check_topic_names(settings: PipelineSettings) -> None:
    named = [("--source", t) for t in settings.sources] + [
        ("--output", settings.output),
        ("--requests-topic", settings.requests_topic),
    ]
    if settings.dlq_topic is not None:
        named.append(("--dlq-topic", settings.dlq_topic))
    for setting, topic in named:
        if not is_topic_name(topic):
            raise ConfigError(
                setting,
                f"{topic!r} is not a legal Kafka topic name",
                f"use 1 to {MAX_TOPIC_LENGTH} characters of a-z A-Z 0-9 . _ -",
            )


def destinations(settings: PipelineSettings) -> Destinations:
    try:
        return Destinations(
            output_topic=settings.output,
            group=settings.group,
            requests_topic=settings.requests_topic,
            per_group_topic=settings.per_group_topic,
            dead_letters=settings.dead_letters,
            dlq_topic=settings.dlq_topic,
        )
    except ValueError as exc:  # the topics are checked already: the group's name
        raise ConfigError(
            "--group",
            str(exc),
            "name the group (with --per-group-topic, in characters a topic name takes)",
        ) from None


def topics(settings: PipelineSettings, destinations: Destinations) -> dict[str, str]:
    """Each topic the query reads or writes, with the option it comes from."""
    topics = {t: "--source" for t in settings.sources}
    for source in settings.sources:
        if settings.per_group_topic:
            topics[destinations.retry_destination(source)] = "--per-group-topic"
        if settings.dead_letters == "topic":
            topics[destinations.dead_letter_topic(source)] = (
                "--dlq-topic" if settings.dlq_topic else "--dead-letters topic"
            )
    topics[settings.output] = "--output"
    topics[settings.requests_topic] = "--requests-topic"
    return topics


def check_topics_exist(broker: Broker, topics: Mapping[str, str]) -> None:
    """Every topic in ``topics`` (name -> the option naming it) exists: Spark's Kafka
    sink does not create topics, and a source that does not exist reads nothing."""
    from confluent_kafka.admin import AdminClient

    from redrive.client_logs import with_client_logs
    from redrive.topic_admin import MetadataUnavailable, TopicMetadata

    config = {"bootstrap.servers": broker.bootstrap, **broker.client_config}
    metadata = TopicMetadata(AdminClient(with_client_logs(config)))
    try:
        missing = {t: opt for t, opt in topics.items() if metadata.partitions_of(t) is None}
    except MetadataUnavailable as exc:
        raise ConfigError(
            "--bootstrap",
            f"cannot read the topics of the broker at {broker.bootstrap}: {exc}",
            "check that the broker runs and is reachable from here, and the address",
        ) from None
    if missing:
        options = sorted(set(missing.values()))
        listed = ", ".join(f"{t!r} ({opt})" for t, opt in missing.items())
        raise ConfigError(
            "/".join(options),
            f"no topic {listed} on the broker at {broker.bootstrap}",
            "create it first (the pipeline creates no topic), or correct the name",
        )


def pairs(option: str, given: tuple[str, ...]) -> dict[str, str]:
    """Repeated ``key=value`` options as a mapping; a ConfigError naming ``option`` for
    one without ``=`` or with an empty key."""
    found: dict[str, str] = {}
    for item in given:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                option, f"{item!r} is not key=value", f"e.g. {option} {EXAMPLES[option]}"
            )
        found[key.strip()] = value
    return found


EXAMPLES = {
    "--conf": "spark.executor.memory=2g",
    "--kafka": "security.protocol=SASL_SSL",
}


def max_offsets(value: int | None) -> int | None:
    if value is not None and value < 1:
        raise ConfigError(
            "--max-offsets-per-trigger",
            f"{value} is not a number of records",
            "give 1 or more (records per micro-batch, over all source partitions)",
        )
    return value


def restarts_of(value: int) -> Restarts:
    """``--restarts``: how often a failed query is started again (``Restarts`` judges
    the value; the error names the option)."""
    try:
        return Restarts(at_most=value)
    except ConfigError as refused:
        raise ConfigError(
            "--restarts",
            f"{value} is not a number of restarts",
            "give 0 (a failed query ends the command) or more",
        ) from refused


def signing(settings: PipelineSettings, environ: Mapping[str, str]) -> KeyRing | None:
    """The keys the pipeline signs with: ``--signing-key`` and ``--signing-key-file``,
    else the environment's (as an App's); a ConfigError naming the option when one is
    bad."""
    if settings.signing_keys or settings.signing_key_files:
        return key_ring(
            settings.signing_keys,
            settings.signing_key_files,
            setting="--signing-key",
            files_setting="--signing-key-file",
        )
    return KeyRing.from_environment(environ)
