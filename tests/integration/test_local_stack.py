"""`redrive local up | status | down` as a user runs them, and the errors they give."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from redrive.errors import ConfigError
from redrive.local import LocalStack
from redrive.local.spark_cluster import LocalSparkCluster

pytestmark = pytest.mark.integration

REDRIVE = [sys.executable, "-m", "redrive.cli"]


def run_cli(
    *args: str, state: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "REDRIVE_STATE_DIR": str(state), **(env or {})}
    return subprocess.run(
        [*REDRIVE, *args], capture_output=True, text=True, env=full_env, timeout=240, check=False
    )


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    """A stack's state folder: whatever the test's `up` started there is stopped at the
    end, also when the test failed before its own `down`."""
    try:
        yield tmp_path
    finally:
        LocalStack(tmp_path).down()


def processes_using(folder: Path) -> list[dict[str, object]]:
    """The processes whose command line names `folder` (what a stack left running)."""
    return [
        p.info
        for p in psutil.process_iter(["pid", "cmdline"])
        if p.info["cmdline"] and any(str(folder) in part for part in p.info["cmdline"])
    ]


def test_up_twice_status_down_leaves_no_process(state: Path) -> None:
    first = run_cli("local", "up", "--kafka-port", "0", "--postgres-port", "0", state=state)
    assert first.returncode == 0, first.stderr
    stack = LocalStack(state)
    kafka_pid = stack.kafka().pid_record()
    postgres_pid = stack.postgres().pid_record()
    assert kafka_pid is not None and kafka_pid.alive()
    assert postgres_pid is not None and postgres_pid.alive()
    try:
        second = run_cli("local", "up", state=state)
        assert second.returncode == 0, second.stderr
        # The second `up` reuses the running servers: same processes, same ports.
        assert stack.kafka().pid_record() == kafka_pid
        assert stack.postgres().pid_record() == postgres_pid

        status = run_cli("local", "status", "--json", state=state)
        assert status.returncode == 0, status.stdout + status.stderr
        report = json.loads(status.stdout)
        assert report["kafka"] == {"running": True, "healthy": True}
        assert report["postgres"] == {"running": True, "healthy": True}
        assert report["bootstrap"] == f"127.0.0.1:{stack.ports().kafka}"
        assert report["database_url"].startswith("postgresql://")
        assert f"127.0.0.1:{stack.ports().postgres}/redrive" in report["database_url"]
    finally:
        down = run_cli("local", "down", state=state)
    assert down.returncode == 0, down.stderr
    assert "kafka" in down.stdout and "postgres" in down.stdout
    for record in (kafka_pid, postgres_pid):
        assert not psutil.pid_exists(record.pid) or not record.alive()
    # No child of the postmaster (or anything else using the state folder) survives.
    assert processes_using(state) == []
    after = run_cli("local", "status", state=state)
    assert after.returncode == 1
    assert "stopped" in after.stdout


@pytest.mark.spark
@pytest.mark.serial
def test_up_with_spark_starts_a_cluster_that_down_stops(state: Path) -> None:
    up = run_cli(
        *("local", "up", "--kafka-port", "0", "--postgres-port", "0"),
        *("--spark", "--spark-port", "0", "--spark-ui-port", "0"),
        state=state,
    )
    assert up.returncode == 0, up.stderr
    cluster = LocalStack(state).spark()
    assert f"Started Spark master on {cluster.master_url()} (2 workers)" in up.stdout
    records = [daemon.pid_record() for daemon in [cluster.master(), *cluster.workers()]]
    assert all(record is not None and record.alive() for record in records)
    try:
        status = run_cli("local", "status", "--json", state=state)
        assert status.returncode == 0, status.stdout + status.stderr
        spark = json.loads(status.stdout)["spark"]
        assert spark["master_url"] == cluster.master_url()
        assert spark["healthy"] and spark["workers_alive"] == spark["workers"] == 2
        # A worker lost: Kafka and PostgreSQL are fine, which the exit code tells apart.
        lost = cluster.workers()[1].pid_record()
        assert lost is not None
        os.kill(lost.pid, signal.SIGKILL)
        degraded = run_cli("local", "status", state=state)
        assert degraded.returncode == 3, degraded.stdout + degraded.stderr
        assert "degraded" in degraded.stdout
        spark_down = run_cli("local", "down", "--spark", state=state)
        assert spark_down.returncode == 0, spark_down.stderr
        assert spark_down.stdout.strip() == "stopped: spark"
        assert not any(record is not None and record.alive() for record in records)
        # Spark alone stopped: no longer part of the status, the rest healthy.
        rest = run_cli("local", "status", state=state)
        assert rest.returncode == 0, rest.stdout + rest.stderr
        assert not any(line.startswith("spark") for line in rest.stdout.splitlines())
    finally:
        down = run_cli("local", "down", state=state)
    assert down.returncode == 0, down.stderr
    assert down.stdout.startswith("stopped: kafka, postgres")
    assert not any(record is not None and record.alive() for record in records)
    assert processes_using(state) == []
    after = run_cli("local", "status", state=state)
    assert after.returncode == 1


def test_an_up_that_fails_stops_the_servers_it_started(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Spark cluster fails to start after the broker and the database did: `up`
    stops those two again, so a failed `up` leaves nothing running."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise ConfigError("spark cluster", "not ready (injected)", "none")

    monkeypatch.setattr(LocalSparkCluster, "up", refuse)
    with pytest.raises(ConfigError, match="injected"):
        LocalStack(state).up(kafka_port=0, postgres_port=0, quiet=True, spark=True)
    stack = LocalStack(state)
    assert not stack.kafka().running()
    assert not stack.postgres().running()
    assert processes_using(state) == []


def test_occupied_port_names_the_setting_and_starts_nothing(state: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        result = run_cli(
            "local", "up", "--kafka-port", str(port), "--postgres-port", "0", state=state
        )
    assert result.returncode == 2
    assert f"kafka port {port}" in result.stderr
    assert "already in use" in result.stderr
    assert "--kafka-port" in result.stderr  # the fix names the option
    assert "Traceback" not in result.stderr
    assert not LocalStack(state).postgres().running()


def test_missing_java_names_java_and_the_fix(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = shutil.which("mvn")
    assert mvn is not None
    (bin_dir / "mvn").symlink_to(mvn)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = f"{bin_dir}:{Path(sys.executable).parent}"  # mvn and python, no java
    env["REDRIVE_STATE_DIR"] = str(tmp_path / "state")
    result = subprocess.run(
        [*REDRIVE, "local", "up", "--kafka-port", "0", "--postgres-port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("redrive: java:")
    assert "Java 17" in result.stderr
    assert "apt-get install" in result.stderr
    assert "Traceback" not in result.stderr


def test_kcat_produces_and_consumes_with_headers(bootstrap: str, new_topic) -> None:  # type: ignore[no-untyped-def]
    kcat = shutil.which("kcat")
    assert kcat is not None, (
        "kcat is installed by the project's set-up (scripts/install-system-deps.sh)"
    )
    topic = new_topic("kcat")
    produce = subprocess.run(
        [
            kcat,
            "-b",
            bootstrap,
            "-P",
            "-t",
            topic,
            "-k",
            "item-7",
            "-H",
            "redrive-attempt=2",
            "-H",
            "trace-id=abc",
        ],
        input="hello from kcat",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert produce.returncode == 0, produce.stderr
    consume = subprocess.run(
        [
            kcat,
            "-b",
            bootstrap,
            "-C",
            "-t",
            topic,
            "-o",
            "beginning",
            "-c",
            "1",
            "-e",
            "-f",
            "%k|%s|%h",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert consume.returncode == 0, consume.stderr
    assert consume.stdout.strip() == "item-7|hello from kcat|redrive-attempt=2,trace-id=abc"
