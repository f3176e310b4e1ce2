"""`redrive local`: the local stack's commands (up, down, status, env, fetch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final

import typer

from redrive.errors import ConfigError

if TYPE_CHECKING:
    from redrive.local import LocalStack, StackStatus

local_app = typer.Typer(
    help="The local stack: a real Kafka broker and an embedded PostgreSQL "
    "(and with --spark a Spark standalone cluster)."
)

StateDir = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="Folder for the stack's data, logs and pids (env REDRIVE_STATE_DIR; "
        "default ~/.local/state/redrive).",
    ),
]


def _stack(state: Path | None) -> LocalStack:
    from redrive.local import LocalStack

    return LocalStack(state.resolve() if state else None)


@local_app.command("up")
def local_up(
    state: StateDir = None,
    kafka_port: Annotated[
        int | None,
        typer.Option(
            help="Broker port on 127.0.0.1 (controller: the next one); 0 for any. "
            "[default 9092, or the port of the last `up`]"
        ),
    ] = None,
    postgres_port: Annotated[
        int | None,
        typer.Option(help="PostgreSQL port on 127.0.0.1; 0 for any. [default 55432]"),
    ] = None,
    spark: Annotated[
        bool,
        typer.Option(
            "--spark",
            help="Also start a Spark standalone cluster (a master and its workers, "
            "1 core and 1g each) from the installed PySpark; needs the spark extra.",
        ),
    ] = False,
    spark_port: Annotated[
        int | None,
        typer.Option(help="Spark master port on 127.0.0.1; 0 for any. [default 7077]"),
    ] = None,
    spark_ui_port: Annotated[
        int | None,
        typer.Option(
            help="Spark master web UI port (the workers' UIs: the next ports); 0 for any. "
            "[default 8180]"
        ),
    ] = None,
    spark_workers: Annotated[
        int | None, typer.Option(help="Spark workers to start. [default 2]")
    ] = None,
) -> None:
    """Start the local Kafka broker and PostgreSQL (harmless if they already run).

    With --spark, also a Spark standalone master and workers on 127.0.0.1, for
    `spark-submit --master spark://127.0.0.1:7077`; see docs/spark.md ("Running on a cluster").
    """
    if not spark and (spark_port, spark_ui_port, spark_workers) != (None, None, None):
        raise ConfigError(
            "--spark-port/--spark-ui-port/--spark-workers",
            "these set up the Spark cluster, which starts only with --spark",
            "add --spark",
        )
    status = _stack(state).up(
        kafka_port,
        postgres_port,
        spark=spark,
        spark_port=spark_port,
        spark_ui_port=spark_ui_port,
        spark_workers=spark_workers,
    )
    _print_status(status)


@local_app.command("down")
def local_down(
    state: StateDir = None,
    spark: Annotated[
        bool,
        typer.Option("--spark", help="Stop the Spark cluster only; Kafka and PostgreSQL go on."),
    ] = False,
) -> None:
    """Stop exactly the processes `up` started (by their recorded pids)."""
    stopped = _stack(state).down(spark_only=spark)
    typer.echo("stopped: " + ", ".join(stopped) if stopped else "nothing was running")


@local_app.command("status")
def local_status(
    state: StateDir = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print the bootstrap address, the database URL and whether each is healthy.

    With a Spark cluster started by `up --spark`, also its master URL and workers.
    Exits 0 if everything is healthy, 1 if Kafka or PostgreSQL is not, 3 if they are
    and the Spark cluster is not (a worker down).
    """
    status = _stack(state).status()
    if as_json:
        report: dict[str, object] = {
            "state_dir": str(status.state_dir),
            "bootstrap": status.bootstrap,
            "database_url": status.database_url,
            "kafka": {"running": status.kafka_running, "healthy": status.kafka_healthy},
            "postgres": {
                "running": status.postgres_running,
                "healthy": status.postgres_healthy,
            },
        }
        if status.spark is not None:
            spark = status.spark
            report["spark"] = {
                "master_url": spark.master_url,
                "ui_url": spark.ui_url,
                "running": spark.master_running,
                "healthy": spark.healthy,
                "workers": spark.workers,
                "workers_running": spark.workers_running,
                "workers_alive": spark.workers_alive,
            }
        typer.echo(json.dumps(report, indent=2))
    else:
        _print_status(status)
    raise typer.Exit(status_code(status))


SPARK_DEGRADED: Final = 3
"""`status`'s exit code when Kafka and PostgreSQL are healthy and Spark is not."""


def status_code(status: StackStatus) -> int:
    """0 all healthy; 1 Kafka or PostgreSQL not (what the App and the service need);
    SPARK_DEGRADED when only the Spark cluster is not."""
    if not status.core_healthy:
        return 1
    return 0 if status.healthy else SPARK_DEGRADED


@local_app.command("env")
def local_env(state: StateDir = None) -> None:
    """Print shell exports pointing redrive at the local stack: eval "$(redrive local env)"."""
    status = _stack(state).status()
    typer.echo(f"export REDRIVE_BOOTSTRAP={status.bootstrap}")
    typer.echo(f"export REDRIVE_DATABASE_URL='{status.database_url}'")


@local_app.command("fetch")
def local_fetch() -> None:
    """Download the broker jars, and the Spark Kafka connector's when PySpark is
    installed, into the cache now (first use does it otherwise)."""
    from redrive.local.kafka import fetch_jars

    typer.echo(f"Kafka jars: {fetch_jars()}")
    try:
        from redrive.spark.session import connector_jars
    except ImportError:  # the spark extra is not installed
        return
    typer.echo(f"Spark connector jars: {len(connector_jars(quiet=False))}")


def _print_status(status: StackStatus) -> None:
    def word(running: bool, healthy: bool) -> str:
        return "healthy" if healthy else ("running, not answering" if running else "stopped")

    typer.echo(
        f"kafka     {word(status.kafka_running, status.kafka_healthy):<8}  {status.bootstrap}"
    )
    typer.echo(
        f"postgres  {word(status.postgres_running, status.postgres_healthy):<8}  "
        f"{status.database_url}"
    )
    if status.spark is not None:
        spark = status.spark
        state = "degraded" if spark.master_running and not spark.healthy else None
        typer.echo(
            f"spark     {state or word(spark.master_running, spark.healthy):<8}  "
            f"{spark.master_url} "
            f"({spark.workers_alive} of {spark.workers} workers alive; UI {spark.ui_url})"
        )
    typer.echo(f"state     {status.state_dir}")
