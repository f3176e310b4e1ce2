"""`redrive local up | status | down` as a user runs them, and the errors they give."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from redrive.errors import ConfigError
from redrive.local import LocalStack
from redrive.local.spark_cluster import LocalSparkCluster
from tests.integration.local_stack_harness import REDRIVE, processes_using, run_cli

pytestmark = pytest.mark.integration


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
