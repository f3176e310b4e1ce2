"""A real single-node Apache Kafka broker in KRaft mode, run from its own jars.

The jars come from Maven Central (`org.apache.kafka:kafka_2.13`, version pinned in
maven/kafka-pom.xml). The data folder is formatted once with
`kafka.tools.StorageTool format`, then `kafka.Kafka` runs as combined broker and
controller, listening on loopback only. The broker is ready when it answers a
metadata request, which is what `start` waits for.
"""

from __future__ import annotations

import base64
import subprocess
import time
import uuid
from pathlib import Path

from confluent_kafka.admin import AdminClient

from redrive import jars
from redrive.client_logs import SILENT, with_client_logs
from redrive.deadlines import Deadline
from redrive.errors import ConfigError
from redrive.local.java import find_java
from redrive.local.paths import resource
from redrive.local.process import (
    LocalServer,
    listener_of,
    port_in_use,
    write_pid,
)
from redrive.local.security import LocalSecurity

KAFKA_POM = "kafka-pom.xml"
HOST = "127.0.0.1"
SHARE_FEATURE = "share.version=2"
"""Share groups (level 1) and their dead-letter topics (level 2)."""
READY_TIMEOUT_S = 90.0
"""A quiet machine's seconds (see redrive.deadlines): more wall time when it is loaded."""


def fetch_jars(*, quiet: bool = False) -> Path:
    return jars.fetch(KAFKA_POM, "the Apache Kafka broker jars", quiet=quiet)


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


class LocalKafka(LocalServer):
    """One broker whose config, data, log and pid file live under `root`."""

    def __init__(
        self,
        root: Path,
        port: int,
        controller_port: int,
        *,
        heap: str = "768m",
        extra_properties: dict[str, str] | None = None,
        security: LocalSecurity | None = None,
    ) -> None:
        self.root = root
        self.port = port
        self.controller_port = controller_port
        self.heap = heap
        self.extra_properties = dict(extra_properties or {})
        self.security = security
        self.data_dir = root / "data"
        self.config_file = root / "server.properties"
        self.log_file = root / "kafka.log"
        self.pid_file = root / "kafka.pid"

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def client_config(self, user: str | None = None) -> dict[str, str]:
        """What a client needs to reach this broker (with credentials when secured): as
        the security's own user, or as ``user``, another of its users (an ACL's
        principal, when the broker runs the authorizer)."""
        config = {"bootstrap.servers": self.bootstrap}
        if self.security is not None:
            config.update(self.security.client_config(user=user))
        elif user is not None:
            raise ValueError(f"user {user!r}: this broker takes no credentials")
        return config

    def healthy(self, timeout: float = 3.0) -> bool:
        """True if the broker answers a metadata request within the timeout."""
        if not self.running():
            return False
        try:
            # Silent: a broker still starting refuses connections, which is expected here.
            admin = AdminClient(with_client_logs(self.client_config(), level=SILENT))
            metadata = admin.list_topics(timeout=timeout)
            return bool(metadata.brokers)
        except Exception:  # noqa: BLE001 - any failure to answer means not healthy
            return False

    def _properties(self) -> dict[str, str]:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{HOST}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            # Share groups keep their state in an internal topic: one broker, one replica.
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # A share group may set a lock as short as a second (Kafka's floor is 15 s):
            # tests of what happens when a lock runs out need not wait that long.
            "group.share.min.record.lock.duration.ms": "1000",
            # A share group's dead-letter topic (its group config
            # errors.deadletterqueue.topic.name, named with the broker's prefix, "dlq." by
            # default) is created on first use, as any topic is on this broker.
            "errors.deadletterqueue.auto.create.topics.enable": "true",
            # A single local broker: no reason to make the first consumer group wait.
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "true",
        }
        if self.security is not None:
            secured = self.security.broker_properties(HOST, self.port)
            secured["listeners"] = secured["listeners"].format(controller=self.controller_port)
            props.update(secured)
        props.update(self.extra_properties)
        return props

    def _write_config(self) -> None:
        lines = [f"{k}={v}" for k, v in self._properties().items()]
        self.config_file.write_text(
            "# written by redrive local; edits are overwritten\n" + "\n".join(lines) + "\n"
        )

    def _check_ports(self) -> None:
        for setting, port in (
            ("kafka port", self.port),
            ("kafka controller port", self.controller_port),
        ):
            if port_in_use(port, HOST):
                raise ConfigError(
                    f"{setting} {port}",
                    f"{HOST}:{port} is already in use by {listener_of(port)}",
                    "stop that process, or choose other ports: "
                    "redrive local up --kafka-port N (the controller uses N+1)",
                )

    def preflight(self) -> str:
        """Check what start needs (Java, free ports) without starting; returns java's path."""
        java = find_java()
        self._check_ports()
        return java

    def start(self, *, quiet: bool = False) -> None:
        """Start the broker unless it runs; return once it answers metadata requests."""
        if self.running():
            return
        java = self.preflight()
        jar_folder = fetch_jars(quiet=quiet)
        self.root.mkdir(parents=True, exist_ok=True)
        if self.security is not None:
            self.security.ensure_certificates()
        self._write_config()
        classpath = f"{jar_folder}/*"
        if not (self.data_dir / "meta.properties").exists():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            fmt = subprocess.run(
                # "=" form: a random id may begin with "-", which would read as an option.
                [
                    java,
                    "-cp",
                    classpath,
                    "kafka.tools.StorageTool",
                    "format",
                    f"--cluster-id={_cluster_id()}",
                    f"--config={self.config_file}",
                    # Share groups with dead-letter topics: the level Kafka 4.4 formats
                    # by default, named so that a Kafka without it fails here, loudly.
                    f"--feature={SHARE_FEATURE}",
                    *(self.security.scram_format_args() if self.security else []),
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if fmt.returncode != 0:
                raise ConfigError(
                    "kafka data folder",
                    f"formatting {self.data_dir} failed: {(fmt.stderr or fmt.stdout)[-800:]}",
                    f"remove {self.data_dir} and run again",
                )
        cmd = [
            java,
            f"-Xmx{self.heap}",
            f"-Xms{self.heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={resource('log4j2.properties')}",
            f"-Dkafka.logs.dir={self.root}",
            "-cp",
            classpath,
            "kafka.Kafka",
            str(self.config_file),
        ]
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.root,
                start_new_session=True,
            )
        write_pid(self.pid_file, proc.pid)
        if not quiet:
            print(f"Starting Kafka broker on {self.bootstrap} (pid {proc.pid})...", flush=True)
        deadline = Deadline(READY_TIMEOUT_S)
        while not deadline.passed():
            if proc.poll() is not None:
                raise ConfigError(
                    "kafka broker",
                    f"exited with code {proc.returncode} during start-up:\n{self.log_tail()}",
                    f"read {self.log_file}",
                )
            if self.healthy(timeout=1.0):
                return
            time.sleep(0.3)
        self.stop()
        raise ConfigError(
            "kafka broker",
            f"did not answer metadata requests within {deadline.describe()}",
            f"read {self.log_file}",
        )
