"""The local stack: one Kafka broker and one PostgreSQL server under a state folder,
and on request (`up --spark`) a Spark standalone cluster.

`stack.json` in the state folder remembers the ports chosen at the first `up`, so
later commands (`status`, `redrive serve`, the demo) find the same servers; the Spark
cluster keeps its own settings in `spark/cluster.json`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from redrive.errors import ConfigError
from redrive.local.kafka import LocalKafka
from redrive.local.paths import state_dir
from redrive.local.postgres import LocalPostgres
from redrive.local.process import free_port
from redrive.local.spark_cluster import LocalSparkCluster, SparkStatus

DEFAULT_KAFKA_PORT = 9092
DEFAULT_POSTGRES_PORT = 55432


@dataclass(frozen=True)
class StackPorts:
    kafka: int
    kafka_controller: int
    postgres: int


@dataclass(frozen=True)
class StackStatus:
    state_dir: Path
    bootstrap: str
    database_url: str
    kafka_running: bool
    kafka_healthy: bool
    postgres_running: bool
    postgres_healthy: bool
    spark: SparkStatus | None = None
    """The Spark cluster, when `up --spark` started it (until `down`)."""

    @property
    def healthy(self) -> bool:
        return self.core_healthy and (self.spark is None or self.spark.healthy)

    @property
    def core_healthy(self) -> bool:
        """Kafka and PostgreSQL, what the App and the retry service need."""
        return self.kafka_healthy and self.postgres_healthy


class LocalStack:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or state_dir()
        self.settings_file = self.root / "stack.json"

    def saved_ports(self) -> StackPorts | None:
        try:
            return StackPorts(**json.loads(self.settings_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def _choose_ports(self, kafka_port: int | None, postgres_port: int | None) -> StackPorts:
        saved = self.saved_ports()
        if kafka_port is None:
            kafka_port = saved.kafka if saved else DEFAULT_KAFKA_PORT
        if postgres_port is None:
            postgres_port = saved.postgres if saved else DEFAULT_POSTGRES_PORT
        # Port 0 asks for any free port (tests run beside a developer's own stack);
        # otherwise the controller listens on the port after the broker's.
        if kafka_port == 0:
            kafka_port, controller = free_port(), free_port()
        elif saved and saved.kafka == kafka_port:
            controller = saved.kafka_controller
        else:
            controller = kafka_port + 1
        postgres_port = postgres_port or free_port()
        for name, port in (("--kafka-port", kafka_port), ("--postgres-port", postgres_port)):
            if not 0 < port < 65536:
                raise ConfigError(name, f"{port} is not a TCP port", "use 1..65535, or 0 for any")
        return StackPorts(kafka=kafka_port, kafka_controller=controller, postgres=postgres_port)

    def ports(self) -> StackPorts:
        saved = self.saved_ports()
        if saved is None:
            raise ConfigError(
                "local stack",
                f"no local stack in {self.root}",
                "start one with: redrive local up",
            )
        return saved

    def kafka(self, ports: StackPorts | None = None) -> LocalKafka:
        p = ports or self.ports()
        return LocalKafka(self.root / "kafka", p.kafka, p.kafka_controller)

    def postgres(self, ports: StackPorts | None = None) -> LocalPostgres:
        p = ports or self.ports()
        return LocalPostgres(self.root / "postgres", p.postgres)

    def spark(self) -> LocalSparkCluster:
        return LocalSparkCluster(self.root / "spark")

    def up(
        self,
        kafka_port: int | None = None,
        postgres_port: int | None = None,
        *,
        quiet: bool = False,
        kafka: bool = True,
        postgres: bool = True,
        spark: bool = False,
        spark_port: int | None = None,
        spark_ui_port: int | None = None,
        spark_workers: int | None = None,
    ) -> StackStatus:
        """Start whatever is not running yet; harmless when everything already runs.

        `kafka` / `postgres` False leave that server alone (e.g. `redrive serve` given a
        database URL needs only the local broker). `spark` True also starts the Spark
        standalone cluster (a master and `spark_workers` workers, 2 by default); False
        leaves it as it is.
        """
        saved = self.saved_ports()
        if saved is not None and (self.kafka(saved).running() or self.postgres(saved).running()):
            wanted = (kafka_port or saved.kafka, postgres_port or saved.postgres)
            if wanted != (saved.kafka, saved.postgres):
                raise ConfigError(
                    "local stack ports",
                    f"the stack in {self.root} already runs on kafka {saved.kafka}, "
                    f"postgres {saved.postgres}",
                    "run `redrive local down` first to change ports",
                )
            ports = saved
        else:
            ports = self._choose_ports(kafka_port, postgres_port)
        self.root.mkdir(parents=True, exist_ok=True)
        self.settings_file.write_text(json.dumps(asdict(ports), indent=2) + "\n")
        broker, database = self.kafka(ports), self.postgres(ports)
        # Check everything before starting anything, so a bad setting leaves nothing behind.
        if kafka and not broker.running():
            broker.preflight()
        if postgres and not database.running():
            database.preflight()
        cluster = self.spark()
        if spark:
            cluster.preflight(cluster.plan(spark_port, spark_ui_port, spark_workers))
        # A server that fails to start stops those this call started: an `up` that
        # fails leaves the machine as it found it.
        started: list[LocalKafka | LocalPostgres] = []
        try:
            if postgres and not database.running():
                database.start(quiet=quiet)
                started.append(database)
            if kafka and not broker.running():
                broker.start(quiet=quiet)
                started.append(broker)
            if spark:
                cluster.up(spark_port, spark_ui_port, spark_workers, quiet=quiet)
        except BaseException:
            for server in reversed(started):
                server.stop()
            raise
        return self.status()

    def down(self, *, spark_only: bool = False) -> list[str]:
        """Stop what `up` started, by recorded pid; with `spark_only` the Spark cluster
        alone. Returns the names of what was stopped."""
        saved = self.saved_ports()
        if saved is None:
            return []
        stopped = []
        if self.spark().down():
            stopped.append("spark")
        if spark_only:
            return stopped
        if self.kafka(saved).stop():
            stopped.append("kafka")
        if self.postgres(saved).stop():
            stopped.append("postgres")
        return stopped

    def status(self) -> StackStatus:
        ports = self.ports()
        kafka, postgres = self.kafka(ports), self.postgres(ports)
        cluster = self.spark()
        return StackStatus(
            state_dir=self.root,
            bootstrap=kafka.bootstrap,
            database_url=postgres.url() if postgres.password_file.exists() else "",
            kafka_running=kafka.running(),
            kafka_healthy=kafka.healthy(),
            postgres_running=postgres.running(),
            postgres_healthy=postgres.healthy(),
            spark=cluster.status() if cluster.enabled() else None,
        )
