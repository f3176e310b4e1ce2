"""docs/spark.md's "Try it on your machine", scripted as written.

`redrive local up --spark` starts the broker, PostgreSQL and a two-worker standalone
cluster; `redrive spark scheduler --master spark://...` runs on it, finding the
broker through the local stack as the docs' command does; the pipeline command runs
as spark-submit's main file on the same cluster, the handler's module shipped with
--py-files (`charges.py` in a zip, importable nowhere else), the jars with --jars,
the master chosen by spark-submit alone. Both get cores; the scheduler brings the
retries back and the pipeline handles them again. Then the stack's Spark part as the
docs describe it: `status` tells a lost worker apart from Kafka and PostgreSQL (exit
code 3), `down --spark` stops Spark alone, `down` the rest.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import psutil
import pytest
from confluent_kafka.admin import AdminClient

import redrive.spark.pipeline_command
from redrive.deadlines import Deadline
from redrive.headers import decode
from redrive.local import LocalStack
from redrive.spark import connector_jars
from tests.conftest import wait_for_topics
from tests.integration.local_stack_harness import processes_using, run_cli
from tests.spark import TopicReader, create_topics
from tests.spark.test_pipeline_command import (
    REPO,
    check_outcomes,
    child_env,
    pipeline_options,
    produce_the_three_cases,
    tail,
    wait_for_outcomes,
)

pytestmark = [pytest.mark.spark, pytest.mark.serial]

PIPELINE_FILE = redrive.spark.pipeline_command.__file__
SPARK_SUBMIT = Path(sys.executable).with_name("spark-submit")  # pip's PySpark puts it there
# The service's default topics, which the scheduler reads and the pipeline writes.
REQUESTS, DLQ = "redrive.requests", "redrive.dlq"


def test_the_docs_cluster_recipe_runs_as_written(state: Path, tmp_path: Path) -> None:
    up = run_cli(
        *("local", "up", "--kafka-port", "0", "--postgres-port", "0"),
        *("--spark", "--spark-port", "0", "--spark-ui-port", "0"),
        state=state,
    )
    assert up.returncode == 0, up.stderr
    stack = LocalStack(state)
    cluster = stack.spark()
    assert f"Started Spark master on {cluster.master_url()} (2 workers)" in up.stdout
    daemons = [daemon.pid_record() for daemon in [cluster.master(), *cluster.workers()]]
    assert all(record is not None and record.alive() for record in daemons)
    status = run_cli("local", "status", "--json", state=state)
    assert status.returncode == 0, status.stdout + status.stderr
    report = json.loads(status.stdout)
    assert report["spark"]["master_url"] == cluster.master_url()
    assert report["spark"]["healthy"] and report["spark"]["workers_alive"] == 2
    bootstrap = report["bootstrap"]

    source, output = "orders", "orders.charged"
    create_topics(bootstrap, source, output, DLQ)
    create_topics(bootstrap, REQUESTS, partitions=6)
    wait_for_topics(AdminClient({"bootstrap.servers": bootstrap}), [source, output, REQUESTS, DLQ])
    run_scheduler_and_pipeline(state, tmp_path, bootstrap, source, output)

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
    assert not any(record is not None and record.alive() for record in daemons)
    # Spark alone stopped: no longer part of the status, the rest healthy.
    rest = run_cli("local", "status", state=state)
    assert rest.returncode == 0, rest.stdout + rest.stderr
    assert not any(line.startswith("spark") for line in rest.stdout.splitlines())
    down = run_cli("local", "down", state=state)
    assert down.returncode == 0, down.stderr
    assert down.stdout.startswith("stopped: kafka, postgres")
    assert processes_using(state) == []
    assert run_cli("local", "status", state=state).returncode == 1


def run_scheduler_and_pipeline(
    state: Path, tmp_path: Path, bootstrap: str, source: str, output: str
) -> None:
    """The docs' two commands, side by side on the stack's cluster, until the
    retryable failure has come back three times and both failures are dead letters;
    then each stopped with SIGTERM, as a service manager stops it, exiting 0."""
    master = LocalStack(state).spark().master_url()
    handlers_zip = tmp_path / "orders.zip"
    with zipfile.ZipFile(handlers_zip, "w") as archive:
        archive.write(REPO / "tests" / "spark" / "pipeline_handlers.py", "charges.py")
    work = tmp_path / "work"  # an empty current directory: `charges` comes from the zip
    work.mkdir()
    scheduler_log, log = tmp_path / "scheduler.log", tmp_path / "spark-submit.log"
    scheduler_command = [
        *(sys.executable, "-m", "redrive.cli", "spark", "scheduler"),
        *("--master", master, "--checkpoint", str(tmp_path / "scheduler")),
        *("--allow", source),
    ]
    command = [
        str(SPARK_SUBMIT),
        *("--master", master, "--executor-memory", "512m"),
        *("--jars", ",".join(str(jar) for jar in connector_jars())),
        *("--py-files", str(handlers_zip)),
        PIPELINE_FILE,
        "charges:handle",
        *pipeline_options(bootstrap, source, output, REQUESTS, tmp_path / "billing", "charges"),
    ]
    env = child_env(PYSPARK_PYTHON=sys.executable)
    with open(scheduler_log, "wb") as out:
        scheduler = subprocess.Popen(
            scheduler_command,
            cwd=work,
            env={**env, "REDRIVE_STATE_DIR": str(state)},  # the broker: the local stack's
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    submit: subprocess.Popen[bytes] | None = None
    reader = TopicReader(bootstrap, [output, REQUESTS, source, DLQ])
    try:
        with open(log, "wb") as out:
            submit = subprocess.Popen(
                command, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        produce_the_three_cases(bootstrap, source)
        wait_for_outcomes(reader, output, REQUESTS, submit, log)
        check_outcomes(reader, source, output, REQUESTS, "charges")

        def came_back() -> list[int]:
            return sorted(
                decode(m.headers)[0].attempt
                for m in reader.of(source)
                if m.key == b"declined" and dict(m.headers).get("redrive-retry-at")
            )

        deadline = Deadline(240)
        while {m.key for m in reader.of(DLQ)} != {b"declined", b"broken"}:
            for process, what in ((scheduler, scheduler_log), (submit, log)):
                if process.poll() is not None:
                    pytest.fail(f"{what.name} exited ({process.returncode}):\n{tail(what)}")
            assert not deadline.passed(), (
                f"retries back: {came_back()}; dead letters {[m.key for m in reader.of(DLQ)]}"
                f"\n{tail(scheduler_log)}\n{tail(log)}"
            )
            reader.poll(0.5)
        # "1s x3": the retryable failure came back three times (each saying how many
        # attempts failed before it), then was given up.
        assert came_back() == [1, 2, 3]
    finally:
        reader.close()
        if submit is not None:
            stop_driver(submit)
        scheduler.send_signal(signal.SIGTERM)
        scheduler.wait(90)
    assert submit.returncode == 0, tail(log)
    assert scheduler.returncode == 0, tail(scheduler_log)


def stop_driver(submit: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the Python driver (spark-submit's child running the main file), as a
    service manager would stop it; then spark-submit exits with the driver's code."""
    if submit.poll() is None:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(submit.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if PIPELINE_FILE in child.cmdline():
                        child.send_signal(signal.SIGTERM)
    try:
        submit.wait(90)
    except subprocess.TimeoutExpired:
        submit.kill()
        submit.wait(30)
