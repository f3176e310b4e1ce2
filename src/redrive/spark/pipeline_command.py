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

import contextlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Final

import typer

from redrive.errors import ConfigError, RedriveError
from redrive.spark import pipeline_checks
from redrive.spark.console import quiet_console
from redrive.spark.delivery import AtLeastOnce, Delivery, ExactlyOnce
from redrive.spark.handler_import import import_handler
from redrive.spark.kafka_options import spark_kafka_options
from redrive.spark.metrics import SparkMetrics, listen
from redrive.spark.pipeline import start_pipeline
from redrive.spark.pipeline_settings import (
    Broker,
    BrokerResolver,
    CheckedPipeline,
    DeadLetters,
    DeliveryName,
    PipelineSettings,
)
from redrive.spark.session import LOG_LEVEL, run_until_stopped, spark_session
from redrive.spark.supervision import Restarts, Supervised
from redrive.topic_names import REQUESTS_TOPIC

DEFAULT_MASTER: Final = "local[2]"

RestartsOption = Annotated[
    int,
    typer.Option(
        help="Times a failed query is started again from its checkpoint within 10 "
        "minutes before the command ends with its error; 0: never.",
    ),
]
"""``--restarts``, of ``redrive spark pipeline`` and ``redrive spark scheduler``."""


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
    spark_conf = pipeline_checks.pairs("--conf", settings.spark_conf)
    if spark_conf and chosen_master is None:
        raise ConfigError(
            "--conf",
            "spark-submit made the session already: this program runs under spark-submit",
            "give --conf to spark-submit, before the program's file",
        )
    kafka = pipeline_checks.pairs("--kafka", settings.kafka)
    pipeline_checks.max_offsets(settings.max_offsets_per_trigger)
    restarts = pipeline_checks.restarts_of(settings.restarts)
    pipeline_checks.check_topic_names(settings)
    handler = import_handler(settings.handler)
    pipeline_policy = pipeline_checks.policy(settings)
    destinations = pipeline_checks.destinations(settings)
    resolved = resolve_broker(bootstrap)
    broker = Broker(resolved.bootstrap, {**resolved.client_config, **kafka})
    kafka_options = spark_kafka_options(broker.client_config)
    pipeline_checks.check_topics_exist(broker, pipeline_checks.topics(settings, destinations))
    return CheckedPipeline(
        settings,
        handler,
        pipeline_policy,
        broker,
        chosen_master,
        spark_conf,
        kafka_options,
        pipeline_checks.signing(settings, os.environ),
        restarts,
    )


def run(checked: CheckedPipeline) -> None:
    """Start the query and block until Ctrl-C or SIGTERM (then stop it cleanly and
    return). A query that fails is started again from its checkpoint, as often as
    ``--restarts`` allows (:class:`redrive.spark.supervision.Restarts`); past that its
    exception is raised."""
    # Under spark-submit the JVM and what it starts write to spark-submit's console.
    console = quiet_console() if checked.master is not None else contextlib.nullcontext()
    with console:
        _run(checked)


def _run(checked: CheckedPipeline) -> None:
    s = checked.settings
    spark = _session(checked.master, f"redrive-pipeline-{s.group}", checked.spark_conf)
    served = None
    delivery: Delivery = AtLeastOnce()
    if s.delivery is DeliveryName.exactly_once:
        delivery = ExactlyOnce(client_config=checked.broker.client_config)
    try:
        if s.metrics_port is not None:
            served = listen(spark, SparkMetrics(), s.metrics_port)
        query = Supervised(
            lambda: start_pipeline(
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
                max_offsets_per_trigger=s.max_offsets_per_trigger,
                delivery=delivery,
                kafka_options=checked.kafka_options,
                query_name=f"redrive-pipeline-{s.group}",
                requests_topic=s.requests_topic,
                per_group_topic=s.per_group_topic,
                dead_letters=s.dead_letters,
                dlq_topic=s.dlq_topic,
                signing=checked.signing,
            ),
            checked.restarts,
        )
        typer.echo(
            f"redrive spark pipeline: {s.handler} on kafka {checked.broker.bootstrap}: "
            f"{', '.join(s.sources)} -> {s.output}; retries to {s.requests_topic}; "
            f"checkpoint {s.checkpoint}; Ctrl-C or SIGTERM stops"
        )
        run_until_stopped([query])
    finally:
        if served is not None:
            served.shutdown()
        spark.stop()
    typer.echo("redrive spark pipeline: stopped")


def _session(master: str | None, app_name: str, conf: Mapping[str, str]) -> Any:
    if master is None:  # spark-submit's: its master, jars (--jars) and --conf settings
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.appName(app_name).getOrCreate()
        # Spark's default is INFO: a progress report per batch. WARN, unless
        # spark-submit was told a level (--conf spark.log.level=INFO).
        if not spark.sparkContext.getConf().contains(LOG_LEVEL):
            spark.sparkContext.setLogLevel("WARN")
        return spark
    return spark_session(app_name, master=master, conf=conf)


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
        per_group_topic: Annotated[
            bool,
            typer.Option(
                "--per-group-topic",
                # Its name before the App and the pipeline shared one options model.
                "--per-group-retry-topic",
                help="Retries come back on <group>.<topic>.retry (read too), not <topic>.",
            ),
        ] = False,
        trigger: Annotated[str, typer.Option(help="Micro-batch interval.")] = "1 second",
        max_offsets_per_trigger: Annotated[
            int | None,
            typer.Option(
                help="Most records one micro-batch reads, over all source partitions "
                "(default: all there are: a first batch takes the whole backlog)."
            ),
        ] = None,
        delivery: Annotated[
            DeliveryName,
            typer.Option(
                help="exactly-once: outputs in Kafka transactions, none written twice "
                "after a restart or a lost task; at-least-once: Spark's Kafka sink."
            ),
        ] = DeliveryName.exactly_once,
        conf: Annotated[
            list[str] | None,
            typer.Option(
                help="A Spark setting key=value (spark.executor.memory=2g); repeatable. "
                "Under spark-submit, give it to spark-submit."
            ),
        ] = None,
        kafka: Annotated[
            list[str] | None,
            typer.Option(
                help="A Kafka client setting key=value, librdkafka's names as in "
                "App(kafka={...}) (security.protocol=SSL); repeatable. Also taken from "
                "the retry service's file in REDRIVE_CONFIG."
            ),
        ] = None,
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
        metrics_port: Annotated[
            int | None,
            typer.Option(
                help="Serve the query's Prometheus metrics on this port (/metrics); "
                "see docs/monitoring.md.",
                show_default=False,
            ),
        ] = None,
        restarts: RestartsOption = Restarts.at_most,
        signing_key: Annotated[
            list[str] | None,
            typer.Option(
                help="A key its requests to the retry service are signed with, "
                "id=base64 secret (the first given signs); repeatable. Unset: "
                "REDRIVE_SIGNING_KEYS. See docs/signing.md.",
                show_default=False,
            ),
        ] = None,
        signing_key_file: Annotated[
            list[str] | None,
            typer.Option(
                help="A file of id=secret lines, or a folder of one file per key; "
                "repeatable. Unset: REDRIVE_SIGNING_KEY_FILES.",
                show_default=False,
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
            per_group_topic=per_group_topic,
            trigger=trigger,
            starting_offsets=starting_offsets,
            delivery=delivery,
            max_offsets_per_trigger=max_offsets_per_trigger,
            spark_conf=tuple(conf or ()),
            kafka=tuple(kafka or ()),
            metrics_port=metrics_port,
            restarts=restarts,
            signing_keys=tuple(signing_key or ()),
            signing_key_files=tuple(signing_key_file or ()),
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
