"""A test that fails, times out or forgets a process leaves nothing running.

An inner pytest run, on two xdist workers as `make test` runs, with the suite's own
fixtures and plugins: a test fails on purpose while its worker's broker and
PostgreSQL run, one times out while they run, one fails inside a Spark standalone
cluster (`tests.spark.running_cluster`, as the cluster tests use it), and one starts a
process and forgets it. Afterwards no process started by the inner run may be alive,
and only the forgotten one may have needed the suite's last-resort check
(tests/plugins/leftovers.py), which kills it and fails the run naming it.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.serial]

REPO = Path(__file__).resolve().parents[2]
RUN_MARK = "REDRIVE_INNER_RUN"
INNER_TIMEOUT_S = 900

INNER_CONFTEST = """
pytest_plugins = ["tests.conftest"]
"""

INNER_TESTS = """
import subprocess
import time

import pytest

from tests.spark import running_cluster


@pytest.mark.xdist_group("stack")
def test_fails_while_the_stack_runs(bootstrap, database_url):
    assert bootstrap and database_url
    assert False, "on purpose"


@pytest.mark.xdist_group("stack")
@pytest.mark.timeout(3)
def test_times_out_while_the_stack_runs(bootstrap):
    time.sleep(120)


def test_fails_inside_a_spark_cluster(tmp_path):
    with running_cluster(tmp_path / "cluster", workers=1) as cluster:
        assert cluster.status().healthy
        assert False, "on purpose, inside the cluster"


def test_forgets_a_process():
    subprocess.Popen(["sleep", "3600"], start_new_session=True)
"""


def processes_of(run: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(RUN_MARK) == run and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_failures_and_timeouts_leave_no_process_behind(tmp_path: Path) -> None:
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "conftest.py").write_text(INNER_CONFTEST)
    (inner / "test_inner.py").write_text(INNER_TESTS)
    run = uuid.uuid4().hex
    env = {**os.environ, RUN_MARK: run, "PYTHONPATH": str(REPO)}
    try:
        result = subprocess.run(
            [
                *(sys.executable, "-m", "pytest", str(inner), "-n", "2"),
                *("-p", "no:cacheprovider", "--basetemp", str(tmp_path / "base")),
                *("--rootdir", str(inner), "-W", "ignore::pytest.PytestUnknownMarkWarning"),
            ],
            cwd=inner,
            env=env,
            capture_output=True,
            text=True,
            timeout=INNER_TIMEOUT_S,
            check=False,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 1, output
        for name in (
            "test_fails_while_the_stack_runs",
            "test_times_out_while_the_stack_runs",
            "test_fails_inside_a_spark_cluster",
        ):
            assert f"FAILED test_inner.py::{name}" in output, output
        assert "Timeout" in output, output
        # The forgotten process is the only one the last-resort check had to kill.
        assert "left running after every fixture was torn down" in output, output
        # pytest prints the report twice (errors section and short summary): read the first.
        report = output.split("left running after every fixture was torn down", 1)[1]
        named = list(
            itertools.takewhile(
                lambda line: line.strip().startswith("pid "), report.splitlines()[1:]
            )
        )
        assert [line.split(": ", 1)[1] for line in named] == ["sleep 3600"], output
        _, alive = psutil.wait_procs(processes_of(run), timeout=10)
        assert alive == [], [proc.cmdline() for proc in alive]
    finally:
        for proc in processes_of(run):
            proc.kill()
