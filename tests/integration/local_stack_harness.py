"""`redrive local ...` run as a user runs it, in a state folder of the test's own.

The ``state`` fixture is a plugin of the test suite (``tests/conftest.py`` names this
module), so that every test module that runs a stack gets it by its name."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from redrive.local import LocalStack

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
    folder = tmp_path / "state"
    folder.mkdir()
    try:
        yield folder
    finally:
        LocalStack(folder).down()


def processes_using(folder: Path) -> list[dict[str, object]]:
    """The processes whose command line names `folder` (what a stack left running)."""
    return [
        p.info
        for p in psutil.process_iter(["pid", "cmdline"])
        if p.info["cmdline"] and any(str(folder) in part for part in p.info["cmdline"])
    ]
