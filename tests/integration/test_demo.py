"""`make demo DEMO_ONESHOT=1`: the items scenario runs and checks its own outcome."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from redrive.local import LocalStack

pytestmark = pytest.mark.integration


def test_the_demo_in_one_shot_mode_passes(local_stack: LocalStack) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDRIVE_")}
    env.update(REDRIVE_STATE_DIR=str(local_stack.root), DEMO_ONESHOT="1")
    result = subprocess.run(
        [sys.executable, "-m", "redrive.cli", "demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "demo passed" in out
    assert "-> 404" in out  # the status was 404 before the item existed
    assert "status set to ACTIVE on attempt" in out
    assert '"status":"ACTIVE"' in out
    assert "it is a dead letter in the retry service's store" in out
    assert "Traceback" not in result.stderr
