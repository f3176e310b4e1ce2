"""Nothing a test starts outlives the run.

Every server a test starts is stopped by a fixture's finaliser, also when the test
fails or times out (pytest-timeout's signal method fails the test, then the
finalisers run). This plugin checks it: each pytest process (the only one, or each
xdist worker) puts a mark of its own in the environment when it starts, which every
process started from it inherits (brokers, databases, Spark daemons and their
executors, `redrive serve`; also those that detach, as PostgreSQL's postmaster
does). Once the session's last fixture is torn down, a process still carrying the
mark was left behind: it is killed, and the run fails naming it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psutil
import pytest

MARK = "REDRIVE_TEST_SESSION"
EXIT_GRACE_S = 5.0


def pytest_configure(config: pytest.Config) -> None:
    os.environ[MARK] = uuid.uuid4().hex


def processes_marked(mark: str) -> list[psutil.Process]:
    """Processes other than this one whose environment carries ``mark``."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(MARK) == mark:
                found.append(proc)
        except psutil.Error:
            continue  # gone, or not ours to read
    return found


def describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid}: {' '.join(proc.cmdline())[:300]}"
    except psutil.Error:
        return f"pid {proc.pid} (gone)"


@pytest.fixture(scope="session", autouse=True)
def nothing_left_running() -> Iterator[None]:
    """Set up before every other fixture, so torn down after all of them."""
    yield
    # A process that is exiting (an executor whose JVM was just stopped) is let go.
    _, left = psutil.wait_procs(processes_marked(os.environ[MARK]), timeout=EXIT_GRACE_S)
    if not left:
        return
    described = [describe(proc) for proc in left]
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(left, timeout=10)
    pytest.fail(
        "left running after every fixture was torn down (now killed):\n  " + "\n  ".join(described),
        pytrace=False,
    )
