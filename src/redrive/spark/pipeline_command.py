"""``redrive spark pipeline MODULE:HANDLER ...``: run a handler as a pipeline query.

The command takes what :func:`redrive.spark.pipeline.start_pipeline` takes, checks
everything it can before the JVM starts (the handler imports and is a plain function
of four parameters, the policy parses, the exception classes import, the topics exist
on the broker), then starts the query and blocks until Ctrl-C or SIGTERM
(:func:`redrive.spark.session.run_until_stopped`). A mistake is one
:class:`redrive.errors.ConfigError` naming the option, exit code 2, in a second, not a
stack trace after a Spark start.

The same command is this file run as a program, so that ``spark-submit`` can be given
it as its main file (``spark-submit ... pipeline_command.py orders:charge --source
...``): it then takes the session spark-submit prepared (its master, jars and
settings). The options are declared once, in :func:`command`; the two entries differ
only in how ``--bootstrap`` defaults (:data:`BrokerResolver`): ``redrive`` falls back
on the retry service's settings and the local stack, as ``redrive spark scheduler``
does, while under spark-submit it must be given.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, Final

import typer

from redrive.errors import ConfigError, RedriveError
from redrive.headers import MAX_TOPIC_LENGTH, is_topic_name
from redrive.policy import Policy, PolicyError
from redrive.policy import policy as make_policy
from redrive.spark.handler_import import import_exception_classes, import_handler
from redrive.spark.pipeline import start_pipeline
from redrive.spark.routing import DeadLetterTarget, Handler, Routing
from redrive.spark.session import run_until_stopped, spark_session
from redrive.topic_names import REQUESTS_TOPIC

DEFAULT_MASTER: Final = "local[2]"


@dataclass(frozen=True)
class Broker:
    """Where the pipeline reads and writes: the bootstrap servers, and librdkafka
    settings (security...) for the topic checks, given to Spark's Kafka clients as
    ``kafka.<name>`` options."""

    bootstrap: str
    client_config: Mapping[str, str] = field(default_factory=dict)


BrokerResolver = Callable[[str | None], Broker]
"""The broker for the ``--bootstrap`` option's value (None when not given)."""


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
    per_group_retry_topic: bool = False
    trigger: str = "1 second"
    starting_offsets: str = "earliest"


@dataclass(frozen=True)
class CheckedPipeline:
    """Settings that passed every check made without Spark, with what they name."""

    settings: PipelineSettings
    handler: Handler
    policy: Policy
    broker: Broker
    master: str | None
    """None: spark-submit's session."""


def launched_by_spark_submit() -> bool:
    """True in a driver program that spark-submit started: PySpark then joins the JVM
    spark-submit launched (through this variable) instead of starting one."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def choose_master(option: str | None) -> str | None:
    """The Spark master to ask for: ``--master``, else local[2]; none under spark-submit,
    which has chosen it (a --master here would silently fight spark-submit's)."""
    if not launched_by_spark_submit():
        return option or DEFAULT_MASTER
    if option is not None:
        raise ConfigError(
            "--master",
            "spark-submit chose the master already: this program runs under spark-submit",
            "give --master to spark-submit, before the program's file",
        )
    return None


def check(
    settings: PipelineSettings,
    *,
    master: str | None,
    bootstrap: str | None,
    resolve_broker: BrokerResolver,
) -> CheckedPipeline:
    """Check the settings against the code and the broker, before anything of Spark
    starts; raises :class:`ConfigError`. ``master`` and ``bootstrap`` are the options'
    values. The broker is resolved last: the redrive CLI may start the local stack."""
    chosen_master = choose_master(master)
    if settings.dlq_topic is not None and settings.dead_letters != "topic":
        raise ConfigError(
            "--dlq-topic",
            "is where dead letters go with --dead-letters topic, which is not given",
            "add --dead-letters topic, or drop --dlq-topic (dead letters then go to the "
            "retry service through the requests topic)",
        )
    _check_topic_names(settings)
    handler = import_handler(settings.handler)
    pipeline_policy = _policy(settings)
    routing = _routing(settings)
    broker = resolve_broker(bootstrap)
    _check_topics_exist(broker, _topics(settings, routing))
    return CheckedPipeline(settings, handler, pipeline_policy, broker, chosen_master)


def run(checked: CheckedPipeline) -> None:
    """Start the query and block until Ctrl-C or SIGTERM (then stop it cleanly and
    return) or until it fails (raise its exception)."""
    s = checked.settings
    spark = _session(checked.master, f"redrive-pipeline-{s.group}")
    try:
        query = start_pipeline(
            spark,
            checked.broker.bootstrap,
            list(s.sources),
            checked.handler,
            policy=checked.policy,
            output_topic=s.output,
            group=s.group,
            checkpoint=s.checkpoint,
            trigger_interval=s.trigger,
            starting_offsets=s.starting_offsets,
            kafka_options={f"kafka.{k}": v for k, v in checked.broker.client_config.items()},
            query_name=f"redrive-pipeline-{s.group}",
            requests_topic=s.requests_topic,
            per_group_retry_topic=s.per_group_retry_topic,
            dead_letters=s.dead_letters,
            dlq_topic=s.dlq_topic,
        )
        typer.echo(
            f"redrive spark pipeline: {s.handler} on kafka {checked.broker.bootstrap}: "
            f"{', '.join(s.sources)} -> {s.output}; retries to {s.requests_topic}; "
            f"checkpoint {s.checkpoint}; Ctrl-C or SIGTERM stops"
        )
        run_until_stopped([query])
    finally:
        spark.stop()


def _session(master: str | None, app_name: str) -> Any:
    if master is None:  # spark-submit's: its master, jars (--jars) and --conf settings
        from pyspark.sql import SparkSession

        return SparkSession.builder.appName(app_name).getOrCreate()
    return spark_session(app_name, master=master)


def _policy(settings: PipelineSettings) -> Policy:
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


def _check_topic_names(settings: PipelineSettings) -> None:
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


def _routing(settings: PipelineSettings) -> Routing:
    try:
        return Routing(
            output_topic=settings.output,
            group=settings.group,
            requests_topic=settings.requests_topic,
            per_group_retry_topic=settings.per_group_retry_topic,
            dead_letters=settings.dead_letters,
            dlq_topic=settings.dlq_topic,
        )
    except ValueError as exc:  # the topics are checked already: the group's name
        raise ConfigError(
            "--group",
            str(exc),
            "name the group (with --per-group-retry-topic, in characters a topic name takes)",
        ) from None


def _topics(settings: PipelineSettings, routing: Routing) -> dict[str, str]:
    """Each topic the query reads or writes, with the option it comes from."""
    topics = {t: "--source" for t in settings.sources}
    for source in settings.sources:
        if settings.per_group_retry_topic:
            topics[routing.retry_destination(source)] = "--per-group-retry-topic"
        if settings.dead_letters == "topic":
            topics[routing.dead_letter_topic(source)] = (
                "--dlq-topic" if settings.dlq_topic else "--dead-letters topic"
            )
    topics[settings.output] = "--output"
    topics[settings.requests_topic] = "--requests-topic"
    return topics


def _check_topics_exist(broker: Broker, topics: Mapping[str, str]) -> None:
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


def command(resolve_broker: BrokerResolver) -> Callable[..., None]:
    """The command function, with its options, for Typer: ``redrive spark pipeline``
    (``resolve_broker`` from the redrive CLI) and this file as spark-submit's main."""

    def pipeline(
        handler: Annotated[
            str,
            typer.Argument(
                metavar="MODULE:HANDLER",
                help="The handler, a function handler(key, value, headers, attempt) -> "
                "bytes | None, e.g. orders:charge (charge in ./orders.py; the current "
                "directory is searched first).",
                show_default=False,
            ),
        ],
        source: Annotated[list[str], typer.Option("--source", help="A topic to read; repeatable.")],
        output: Annotated[str, typer.Option(help="The topic the handler's results go to.")],
        group: Annotated[
            str,
            typer.Option(help="The pipeline's consumer group, written in redrive-group."),
        ],
        policy: Annotated[
            str, typer.Option(help='Retry schedule, e.g. "5s x3, 1m x2" (redrive policy explain).')
        ],
        checkpoint: Annotated[
            str,
            typer.Option(
                help="The query's checkpoint folder (a path, hdfs://, s3a://...): a "
                "restart resumes there."
            ),
        ],
        retry_on: Annotated[
            list[str] | None,
            typer.Option(
                help="An exception class to retry, dotted (orders.PaymentDeclined, "
                "TimeoutError); repeatable. Given: other errors are dead letters at once."
            ),
        ] = None,
        fatal_on: Annotated[
            list[str] | None,
            typer.Option(help="An exception class never retried, dotted; repeatable."),
        ] = None,
        requests_topic: Annotated[
            str,
            typer.Option(
                envvar="REDRIVE_REQUESTS_TOPIC",
                help="Where retry requests go, for redrive serve or redrive spark scheduler.",
            ),
        ] = REQUESTS_TOPIC,
        dead_letters: Annotated[
            DeadLetters,
            typer.Option(
                help="service: to the requests topic, for the retry service's store "
                "(redrive-send-to: dlq); topic: to a DLQ topic."
            ),
        ] = DeadLetters.service,
        dlq_topic: Annotated[
            str | None,
            typer.Option(help="With --dead-letters topic: the DLQ topic (default <source>.dlq)."),
        ] = None,
        per_group_retry_topic: Annotated[
            bool,
            typer.Option(
                "--per-group-retry-topic",
                help="Retries come back on <group>.<topic>.retry (read too), not <topic>.",
            ),
        ] = False,
        trigger: Annotated[str, typer.Option(help="Micro-batch interval.")] = "1 second",
        starting_offsets: Annotated[
            str, typer.Option(help="Where a first run starts: earliest, latest or JSON.")
        ] = "earliest",
        master: Annotated[
            str | None,
            typer.Option(
                help=f"Spark master URL (default {DEFAULT_MASTER}; under spark-submit, "
                "spark-submit's).",
                show_default=False,
            ),
        ] = None,
        bootstrap: Annotated[
            str | None,
            typer.Option(
                help="Kafka bootstrap servers (env REDRIVE_BOOTSTRAP). Unset, redrive uses "
                "the retry service's settings, else the local stack."
            ),
        ] = None,
    ) -> None:
        """Run a handler on Kafka records as a Spark query, with retries and dead letters.

        A failure becomes a retry request (brought back by `redrive serve` or
        `redrive spark scheduler`) or a dead letter. The topics must exist.

        Runs until Ctrl-C or SIGTERM. See docs/spark.md.
        """
        settings = PipelineSettings(
            handler=handler,
            sources=tuple(source),
            output=output,
            group=group,
            policy=policy,
            checkpoint=checkpoint,
            retry_on=tuple(retry_on or ()),
            fatal_on=tuple(fatal_on or ()),
            requests_topic=requests_topic,
            dead_letters="topic" if dead_letters is DeadLetters.topic else "service",
            dlq_topic=dlq_topic,
            per_group_retry_topic=per_group_retry_topic,
            trigger=trigger,
            starting_offsets=starting_offsets,
        )
        run(check(settings, master=master, bootstrap=bootstrap, resolve_broker=resolve_broker))

    return pipeline


def broker_from_option(bootstrap: str | None) -> Broker:
    """spark-submit's ``--bootstrap``: given, or REDRIVE_BOOTSTRAP. No local stack is
    started on a cluster's driver."""
    given = bootstrap or os.environ.get("REDRIVE_BOOTSTRAP")
    if not given:
        raise ConfigError(
            "--bootstrap",
            "not given, and REDRIVE_BOOTSTRAP is not set",
            "pass --bootstrap HOST:PORT,... with brokers that the driver and the executors reach",
        )
    return Broker(given)


def main() -> None:
    """spark-submit's entry (this file as the main program): the command's options,
    errors as one line and exit code 2, as with `redrive`."""
    # Run as a file, Python put this file's folder first on sys.path, where session.py,
    # pipeline.py... would shadow the user's modules of the same names.
    if sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
        del sys.path[0]
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(command(broker_from_option))
    try:
        app()
    except RedriveError as exc:
        print(f"redrive: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
