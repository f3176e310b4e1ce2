"""What the benchmarks share: a private local stack, topics, the service as a process,
and the result table (ratio first, then the absolute figures)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.cimpl import NewTopic

from redrive.local import LocalStack, StackStatus


@dataclass
class Result:
    name: str
    ratio: str  # e.g. "0.31x of raw Kafka"
    goal: str
    met: bool | None
    figures: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        verdict = {True: "met", False: "NOT MET", None: "-"}[self.met]
        figures = ", ".join(f"{k}={v}" for k, v in self.figures.items())
        return f"{self.name:<40} {self.ratio:<34} {self.goal:<26} {verdict:<8} {figures}"


def print_table(results: list[Result]) -> None:
    print()
    print(f"{'benchmark':<40} {'ratio':<34} {'goal':<26} {'verdict':<8} figures")
    print("-" * 152)
    for result in results:
        print(result.line())


@contextmanager
def private_stack() -> Iterator[StackStatus]:
    """A broker and database of the benchmark's own, on free ports, stopped and deleted
    afterwards: a full run writes gigabytes of topic data. (REDRIVE_BENCH_STATE_DIR
    names a folder to use instead, which is kept.)"""
    kept = os.environ.get("REDRIVE_BENCH_STATE_DIR")
    root = kept or tempfile.mkdtemp(prefix="redrive-bench-")
    stack = LocalStack(Path(root))
    try:
        status = stack.up(kafka_port=0, postgres_port=0, quiet=True)
        _delete_topic_files_at_once(status.bootstrap)
        yield status
    finally:
        try:
            stack.down()
        finally:
            if not kept:
                shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class Servers:
    """The broker and the PostgreSQL server a run uses. Every benchmark makes topics
    and databases of its own on them (``database_url`` names the server)."""

    bootstrap: str
    database_url: str


@contextmanager
def servers(bootstrap: str | None = None, database_url: str | None = None) -> Iterator[Servers]:
    """The broker and PostgreSQL server given, left as they are (neither started, nor
    stopped, nor reconfigured); else a :func:`private_stack`'s."""
    if bootstrap is not None and database_url is not None:
        yield Servers(bootstrap, database_url)
        return
    with private_stack() as status:
        yield Servers(status.bootstrap, status.database_url)


@contextmanager
def checkpoint_folder(prefix: str) -> Iterator[Path]:
    """A temporary folder for Spark checkpoints, deleted afterwards. query.stop() returns
    before Spark's state-store maintenance thread is done, which may still write a
    snapshot into the folder while it is being deleted ("Directory not empty"): the
    deletion is tried again for a few seconds and, if that thread outlives it, left."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        for _ in range(20):
            shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                break
            time.sleep(0.25)


def create_topic(bootstrap: str, prefix: str, partitions: int) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=partitions)])[name].result(30)
    return name


def _delete_topic_files_at_once(bootstrap: str) -> None:
    """A deleted topic's files are removed a minute later by default
    (`log.segment.delete.delay.ms`): in the middle of whichever run comes then. At
    once, they go while the run that wrote them is being cleaned up."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    brokers = [
        ConfigResource(ConfigResource.Type.BROKER, str(broker_id))
        for broker_id in admin.list_topics(timeout=30).brokers
    ]
    at_once = ConfigEntry(
        "log.segment.delete.delay.ms", "0", incremental_operation=AlterConfigOpType.SET
    )
    for broker in brokers:
        broker.add_incremental_config(at_once)
    for future in admin.incremental_alter_configs(brokers).values():
        future.result(30)


def quiet_machine() -> None:
    """Before a run's clock starts: write back the files earlier runs left in the page
    cache (their topics, their databases' tables and WAL), so that the kernel's
    writeback does not compete with this run for the CPU and the disk."""
    os.sync()


def delete_topics(bootstrap: str, names: list[str]) -> None:
    """Delete a run's topics once it is over, so that every run meets the broker as the
    first did (not with the logs of all the runs before it)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(names).values():
        future.result(30)


def _on_server(url: str, statement: str) -> None:
    """Run a statement on the server of `url` (from its maintenance database)."""
    with psycopg.connect(f"{url.rpartition('/')[0]}/postgres", autocommit=True) as conn:
        conn.execute(statement.encode())


def drop_database(database_url: str) -> None:
    """Drop a run's fresh database once it is over (its rows and their vacuuming gone)."""
    _on_server(database_url, f'DROP DATABASE "{database_url.rpartition("/")[2]}" WITH (FORCE)')


def quiet_database(database_url: str, timeout_s: float = 60) -> None:
    """Before a run's clock starts: let autovacuum finish with what earlier runs left
    (the rows they deleted), then write a checkpoint, so that a run does not pay for
    the one before it. Every run against PostgreSQL starts this way."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            busy = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
            ).fetchone()
            if busy is None or busy[0] == 0:
                break
            time.sleep(0.2)
        conn.execute("CHECKPOINT")


def fresh_database(server_url: str) -> str:
    name = f"bench_{uuid.uuid4().hex[:10]}"
    _on_server(server_url, f'CREATE DATABASE "{name}"')
    return f"{server_url.rpartition('/')[0]}/{name}"


class ServiceProcess:
    """`redrive serve` as its own process (so its memory can be measured)."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env = {**os.environ, **env, "REDRIVE_HTTP_PORT": "0", "REDRIVE_LOG_FORMAT": "json"}
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.peak_rss = 0

    def __enter__(self) -> ServiceProcess:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "redrive.cli", "serve"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 90
        while "redrive serve: listening" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(self.log.read_text()[-3000:])
            time.sleep(0.1)
        return self

    def sample_rss(self) -> int:
        assert self.proc is not None
        rss = psutil.Process(self.proc.pid).memory_info().rss
        self.peak_rss = max(self.peak_rss, rss)
        return rss

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        workers = psutil.Process(self.proc.pid).children(recursive=True)
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            print(f"benchmark: {self.log.name}'s service did not stop in 60 s; killed")
            for proc in [psutil.Process(self.proc.pid), *workers]:
                with suppress(psutil.Error):
                    proc.kill()
            self.proc.wait(10)


class CpuMeter:
    """Where the machine's CPU went during a run: seconds of CPU used by the broker,
    PostgreSQL (all its processes), the named processes (services, a relay) and this
    benchmark process itself. Sampled on a thread of its own while the run goes, so a
    process that ends before the run does still counts; reported per message, in
    microseconds."""

    # Finding the processes scans all of them, about 8 ms of CPU here: done once a
    # second. Between scans only the known ones are read (well under 1 ms), so that
    # one ending (a relay, a PostgreSQL backend) loses at most 0.1 s of its CPU.
    SCAN_S = 1.0
    SAMPLE_S = 0.1

    def __init__(self, named: dict[int, str]) -> None:
        self.named = named
        self.first: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}
        self._known: dict[int, tuple[str, psutil.Process]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _part(self, proc: psutil.Process) -> str | None:
        if proc.pid in self.named:
            return self.named[proc.pid]
        if proc.info["ppid"] in self.named:  # a named process's workers count as it does
            return self.named[proc.info["ppid"]]
        if proc.pid == os.getpid():
            return "benchmark"
        name = proc.info["name"] or ""
        if name.startswith("postgres"):
            return "postgres"
        if "kafka.Kafka" in " ".join(proc.info["cmdline"] or []):
            return "kafka"
        return None

    def _scan(self) -> None:
        for proc in psutil.process_iter(["name", "cmdline", "ppid"]):
            try:
                part = self._part(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if part is not None:
                self._known.setdefault(proc.pid, (part, proc))
        self._sample_known()

    def _sample_known(self) -> None:
        for pid, (part, proc) in list(self._known.items()):
            try:
                times = proc.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                del self._known[pid]
                continue
            used = times.user + times.system
            self.first.setdefault(pid, used)
            self.last[pid] = (part, used)

    def _run(self) -> None:
        scanned = time.monotonic()
        while not self._stop.wait(self.SAMPLE_S):
            if time.monotonic() - scanned >= self.SCAN_S:
                scanned = time.monotonic()
                self._scan()
            else:
                self._sample_known()

    def start(self) -> None:
        self.first.clear()
        self.last.clear()
        self._known.clear()
        self._scan()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="cpu-meter", daemon=True)
        self._thread.start()

    def us_per_message(self, n: int) -> dict[str, float]:
        """CPU per message of each part since `start`; ends the sampling."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._scan()
        parts: dict[str, float] = {}
        for pid, (part, used) in self.last.items():
            parts[part] = parts.get(part, 0.0) + used - self.first.get(pid, 0.0)
        return {part: round(seconds / n * 1e6, 1) for part, seconds in sorted(parts.items())}


def _produce_all(producer: Producer, messages: list[tuple[str, Any, Any, Any]]) -> None:
    """Produce (topic, key, value, headers) each, then wait for the broker's acks."""
    for topic, key, value, headers in messages:
        while True:
            try:
                producer.produce(topic, key=key, value=value, headers=headers)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(120)
