"""A Spark standalone cluster on loopback: one master and its workers, from PySpark.

The pip-installed PySpark ships Spark's jars and `bin/spark-class`, but not the
`sbin/start-*.sh` scripts, so the daemons are started as Spark's own scripts would:
``spark-class org.apache.spark.deploy.master.Master`` and ``...worker.Worker``, each
a process recorded in a pid file (like the broker), its output in a log file, all
under one folder. Nothing is downloaded.

Each worker offers 1 core and :data:`WORKER_MEMORY` to executors; an application's
executors take 1 core each. The cluster is ready when the master's JSON endpoint
(``http://127.0.0.1:<ui>/json/``) lists every worker as ``ALIVE``.

Everything a daemon or executor writes stays in the folder: the executors' scratch
space (``SPARK_LOCAL_DIRS``), their work dirs (logs, fetched jars and files), and the
Python workers' temporary files (``TMPDIR``), so that `down` plus deleting the folder
leaves nothing behind.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from redrive.deadlines import Deadline
from redrive.errors import ConfigError
from redrive.local.java import find_java
from redrive.local.process import LocalServer, free_port, listener_of, port_in_use, write_pid

HOST = "127.0.0.1"
DEFAULT_MASTER_PORT = 7077
# Spark's own default for the master's web UI, 8080, is `redrive serve`'s HTTP port.
DEFAULT_UI_PORT = 8180
DEFAULT_WORKERS = 2
MAX_WORKERS = 16
WORKER_CORES = 1
WORKER_MEMORY = "1g"
DAEMON_MEMORY = "512m"
READY_TIMEOUT_S = 90.0
"""A quiet machine's seconds (see redrive.deadlines): more wall time when it is loaded."""

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    """The installed PySpark's folder (Spark's jars and bin/), without importing it."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ConfigError(
            "--spark",
            "the local Spark cluster runs from PySpark, which is not installed",
            "pip install 'redrive[spark]'",
        )
    home = Path(spec.origin).parent
    if not (home / "bin" / "spark-class").exists():
        raise ConfigError(
            "--spark",
            f"{home} has no bin/spark-class (not a full PySpark installation)",
            "reinstall PySpark: pip install --force-reinstall 'redrive[spark]'",
        )
    return home


@dataclass(frozen=True)
class ClusterSettings:
    """What `up --spark` chose, kept in ``<folder>/cluster.json`` for later commands.

    ``enabled`` is True from `up --spark` until `down`: while it is, `status` reports
    the cluster and counts it in the stack's health.
    """

    master_port: int
    ui_port: int
    worker_ui_ports: list[int] = field(default_factory=list)
    enabled: bool = True

    @property
    def workers(self) -> int:
        return len(self.worker_ui_ports)


@dataclass(frozen=True)
class SparkStatus:
    master_url: str
    ui_url: str
    workers: int
    """How many workers the cluster has."""
    master_running: bool
    workers_running: int
    """Worker processes alive, by their pid files."""
    workers_alive: int
    """Workers the master reports ALIVE (0 when it does not answer)."""

    @property
    def healthy(self) -> bool:
        return self.master_running and self.workers_alive >= self.workers


def _fetch_json(url: str, timeout: float) -> Any:
    # No proxy: the master listens on loopback, whatever http_proxy says.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as response:
        return json.loads(response.read().decode())


class SparkDaemon(LocalServer):
    """One master or worker JVM started with `spark-class`, known by its pid file."""

    def __init__(self, root: Path, name: str, main_class: str, args: list[str]) -> None:
        self.root = root
        self.name = name
        self.main_class = main_class
        self.args = args
        self.pid_file = root / f"{name}.pid"
        self.log_file = root / f"{name}.log"

    def start(self, spark_class: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                [str(spark_class), self.main_class, *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.root,
                env=env,
                start_new_session=True,  # Ctrl-C in the terminal is not for the cluster
            )
        # spark-class execs the JVM: this pid (and start time) is the daemon's own.
        write_pid(self.pid_file, proc.pid)
        return proc


class LocalSparkCluster:
    """A master and ``workers`` workers whose settings, logs, pids and scratch space
    live under ``root``.

    Ports: the master's RPC port and web UI port, and one web UI port per worker (the
    next ports after the master's UI, or free ones when ``ui_port`` is 0). A worker's
    own RPC port is any free one.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.settings_file = root / "cluster.json"

    # ------------------------------------------------------------------ settings

    def saved(self) -> ClusterSettings | None:
        try:
            data = json.loads(self.settings_file.read_text())
            return ClusterSettings(
                master_port=int(data["master_port"]),
                ui_port=int(data["ui_port"]),
                worker_ui_ports=[int(p) for p in data["worker_ui_ports"]],
                enabled=bool(data.get("enabled", True)),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _save(self, settings: ClusterSettings) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.settings_file.write_text(json.dumps(asdict(settings), indent=2) + "\n")

    def enabled(self) -> bool:
        """True from `up --spark` until `down`."""
        saved = self.saved()
        return saved is not None and saved.enabled

    def choose(
        self,
        master_port: int | None = None,
        ui_port: int | None = None,
        workers: int | None = None,
    ) -> ClusterSettings:
        """The settings for a start: those given, else those of the last start, else
        the defaults; 0 asks for free ports."""
        saved = self.saved()
        if workers is None:
            workers = saved.workers if saved else DEFAULT_WORKERS
        if not 1 <= workers <= MAX_WORKERS:
            raise ConfigError(
                "--spark-workers", f"{workers} workers", f"use 1..{MAX_WORKERS} (default 2)"
            )
        if master_port is None:
            master_port = saved.master_port if saved else DEFAULT_MASTER_PORT
        master_port = master_port or free_port()
        if ui_port is None:
            ui_port = saved.ui_port if saved else DEFAULT_UI_PORT
        if ui_port == 0:
            ui_port = free_port()
            worker_ports = [free_port() for _ in range(workers)]
        elif saved and saved.ui_port == ui_port and saved.workers == workers:
            worker_ports = list(saved.worker_ui_ports)
        else:
            worker_ports = [ui_port + n for n in range(1, workers + 1)]
        for option, port in (
            ("--spark-port", master_port),
            ("--spark-ui-port", ui_port),
            ("--spark-ui-port", max(worker_ports)),
        ):
            if not 0 < port < 65536:
                raise ConfigError(option, f"{port} is not a TCP port", "use 1..65535, or 0 for any")
        return ClusterSettings(master_port, ui_port, worker_ports)

    def settings(self) -> ClusterSettings:
        saved = self.saved()
        if saved is None:
            raise ConfigError(
                "spark cluster",
                f"no Spark cluster in {self.root}",
                "start one with: redrive local up --spark",
            )
        return saved

    # ------------------------------------------------------------------ processes

    def master(self, settings: ClusterSettings | None = None) -> SparkDaemon:
        s = settings or self.settings()
        return SparkDaemon(
            self.root,
            "master",
            MASTER_CLASS,
            ["--host", HOST, "--port", str(s.master_port), "--webui-port", str(s.ui_port)],
        )

    def workers(self, settings: ClusterSettings | None = None) -> list[SparkDaemon]:
        s = settings or self.settings()
        return [
            SparkDaemon(
                self.root,
                f"worker-{n}",
                WORKER_CLASS,
                [
                    self.master_url(s),
                    "--host",
                    HOST,
                    "--cores",
                    str(WORKER_CORES),
                    "--memory",
                    WORKER_MEMORY,
                    "--work-dir",
                    str(self.root / f"worker-{n}" / "work"),
                    "--webui-port",
                    str(ui),
                ],
            )
            for n, ui in enumerate(s.worker_ui_ports, start=1)
        ]

    def master_url(self, settings: ClusterSettings | None = None) -> str:
        s = settings or self.settings()
        return f"spark://{HOST}:{s.master_port}"

    def ui_url(self, settings: ClusterSettings | None = None) -> str:
        s = settings or self.settings()
        return f"http://{HOST}:{s.ui_port}"

    def _env(self, java: str, worker: int | None) -> dict[str, str]:
        """The daemons' environment; executors inherit a worker's."""
        env = dict(os.environ)
        env["SPARK_HOME"] = str(spark_home())
        env.setdefault("JAVA_HOME", str(Path(java).resolve().parent.parent))
        env["SPARK_LOCAL_IP"] = HOST  # bind to loopback only, executors too
        env["SPARK_DAEMON_MEMORY"] = DAEMON_MEMORY
        # A port taken between the check and the start is an error, not port + 1.
        # No hsperfdata file in /tmp either (a killed daemon would leave its own).
        # The JIT's first tier only: a master or worker only answers RPCs and
        # heartbeats, never hot code worth the optimising compiler, which would be
        # much of what the daemons spend starting (and more memory); the executors'
        # JVMs are not daemons and keep the JVM's defaults.
        env["SPARK_DAEMON_JAVA_OPTS"] = (
            "-Dspark.port.maxRetries=0 -XX:-UsePerfData -XX:TieredStopAtLevel=1"
        )
        scratch = self.root / ("master" if worker is None else f"worker-{worker}")
        (scratch / "local").mkdir(parents=True, exist_ok=True)
        (scratch / "tmp").mkdir(parents=True, exist_ok=True)
        env["SPARK_LOCAL_DIRS"] = str(scratch / "local")
        env["TMPDIR"] = str(scratch / "tmp")
        env.pop("SPARK_CONF_DIR", None)
        return env

    # ------------------------------------------------------------------ lifecycle

    def preflight(self, settings: ClusterSettings) -> tuple[Path, str]:
        """Check what start needs (PySpark, Java, free ports) without starting anything.
        Returns spark-class's path and java's."""
        spark_class = spark_home() / "bin" / "spark-class"
        java = find_java()
        master = self.master(settings)
        checks: list[tuple[str, int]] = []
        if not master.running():
            checks += [
                ("spark master port", settings.master_port),
                ("spark web UI port", settings.ui_port),
            ]
        for worker, port in zip(self.workers(settings), settings.worker_ui_ports, strict=True):
            if not worker.running():
                checks.append((f"spark {worker.name} web UI port", port))
        for setting, port in checks:
            if port_in_use(port, HOST):
                raise ConfigError(
                    f"{setting} {port}",
                    f"{HOST}:{port} is already in use by {listener_of(port)}",
                    "stop that process, or choose other ports: redrive local up --spark "
                    "--spark-port N --spark-ui-port M (workers' UIs: M+1, M+2...); 0 for any",
                )
        return spark_class, java

    def plan(
        self,
        master_port: int | None = None,
        ui_port: int | None = None,
        workers: int | None = None,
    ) -> ClusterSettings:
        """The settings `up` would use. A cluster that runs keeps its own: asking for
        other ports or another number of workers is an error until `down`."""
        saved = self.saved()
        if saved is None or not self._any_running(saved):
            return self.choose(master_port, ui_port, workers)
        # None or 0 ("any port"): whatever it runs on.
        wanted = (
            master_port or saved.master_port,
            ui_port or saved.ui_port,
            workers or saved.workers,
        )
        if wanted != (
            saved.master_port,
            saved.ui_port,
            saved.workers,
        ):
            raise ConfigError(
                "local spark cluster",
                f"the cluster in {self.root} already runs: master port "
                f"{saved.master_port}, web UI {saved.ui_port}, {saved.workers} workers",
                "run `redrive local down` first to change its settings",
            )
        return ClusterSettings(saved.master_port, saved.ui_port, saved.worker_ui_ports)

    def up(
        self,
        master_port: int | None = None,
        ui_port: int | None = None,
        workers: int | None = None,
        *,
        quiet: bool = False,
    ) -> SparkStatus:
        """Start the master and workers that are not running; return once the master
        reports every worker ALIVE. Harmless when the cluster already runs."""
        settings = self.plan(master_port, ui_port, workers)
        spark_class, java = self.preflight(settings)
        self._save(settings)
        master = self.master(settings)
        started: list[tuple[SparkDaemon, subprocess.Popen[bytes]]] = []
        try:
            if not master.running():
                started.append((master, master.start(spark_class, self._env(java, None))))
            self._wait(settings, started, workers_alive=0)
            for n, worker in enumerate(self.workers(settings), start=1):
                if not worker.running():
                    started.append((worker, worker.start(spark_class, self._env(java, n))))
            self._wait(settings, started, workers_alive=settings.workers)
        except BaseException:
            for daemon, _ in reversed(started):
                daemon.stop(timeout=10)
            raise
        if not quiet and started:
            print(
                f"Started Spark master on {self.master_url(settings)} "
                f"({settings.workers} workers), web UI {self.ui_url(settings)}",
                flush=True,
            )
        return self.status()

    def _wait(
        self,
        settings: ClusterSettings,
        started: list[tuple[SparkDaemon, subprocess.Popen[bytes]]],
        *,
        workers_alive: int,
    ) -> None:
        """Wait until the master answers and reports ``workers_alive`` workers ALIVE."""
        deadline = Deadline(READY_TIMEOUT_S)
        alive = -1
        while not deadline.passed():
            for daemon, proc in started:
                if proc.poll() is not None:
                    raise ConfigError(
                        f"spark {daemon.name}",
                        f"exited with code {proc.returncode} during start-up:\n{daemon.log_tail()}",
                        f"read {daemon.log_file}",
                    )
            alive = self._alive_workers(settings, timeout=1.0)
            if alive >= workers_alive:
                return
            time.sleep(0.3)
        if alive < 0:
            culprit = self.master(settings)
        else:
            new_workers = [daemon for daemon, _ in started if daemon.name != "master"]
            culprit = (new_workers or self.workers(settings))[0]
        what = (
            "the master's web UI did not answer"
            if alive < 0
            else f"{alive} of {workers_alive} workers registered"
        )
        raise ConfigError(
            "spark cluster",
            f"not ready within {deadline.describe()}: {what} "
            f"({self.ui_url(settings)}/json/); the end of {culprit.log_file.name}:\n"
            f"{culprit.log_tail()}",
            f"read the logs in {self.root}",
        )

    def _alive_workers(self, settings: ClusterSettings, timeout: float = 3.0) -> int:
        """Workers the master reports ALIVE; -1 when it does not answer as our master."""
        try:
            report = _fetch_json(f"{self.ui_url(settings)}/json/", timeout)
        except (OSError, ValueError):
            return -1
        if not isinstance(report, dict) or report.get("url") != self.master_url(settings):
            return -1
        return sum(1 for w in report.get("workers", []) if w.get("state") == "ALIVE")

    def _any_running(self, settings: ClusterSettings) -> bool:
        daemons = [self.master(settings), *self.workers(settings)]
        return any(d.running() for d in daemons)

    def down(self) -> bool:
        """Stop the workers, then the master, by recorded pid; True if any ran.
        A worker stops its executors as it goes."""
        saved = self.saved()
        if saved is None:
            return False
        stopped = False
        for daemon in [*self.workers(saved), self.master(saved)]:
            stopped = daemon.stop() or stopped
        if saved.enabled:
            self._save(
                ClusterSettings(saved.master_port, saved.ui_port, saved.worker_ui_ports, False)
            )
        return stopped

    def status(self) -> SparkStatus:
        settings = self.settings()
        master = self.master(settings)
        running = master.running()
        return SparkStatus(
            master_url=self.master_url(settings),
            ui_url=self.ui_url(settings),
            workers=settings.workers,
            master_running=running,
            workers_running=sum(w.running() for w in self.workers(settings)),
            workers_alive=max(self._alive_workers(settings), 0) if running else 0,
        )
