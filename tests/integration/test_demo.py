"""`make demo DEMO_ONESHOT=1`: the items scenario runs and checks its own outcome."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request

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
    # librdkafka's own log lines (`%4|...|GETPID|...`) go through redrive's logging,
    # quiet in the demo, instead of onto the screen raw.
    assert not re.search(r"^%\d\|", result.stderr, re.MULTILINE), result.stderr
    # The address it prints serves the web UI's overview.
    assert "web UI: http://127.0.0.1:" in out


def test_the_ui_address_the_demo_prints_shows_the_dead_letter(local_stack: LocalStack) -> None:
    """As a new user: run the demo, open the address it prints, see the dead letter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDRIVE_", "DEMO_"))}
    env["REDRIVE_STATE_DIR"] = str(local_stack.root)
    proc = subprocess.Popen(
        [sys.executable, "-m", "redrive.cli", "demo"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = None
        for line in proc.stdout:
            if line.startswith("web UI: "):
                url = line.removeprefix("web UI: ").strip()
            if "Running until Ctrl-C" in line:
                break
        assert url, "the demo printed no UI address"
        with urllib.request.urlopen(url, timeout=10) as response:
            overview = response.read().decode()
        assert response.status == 200
        assert "Overview" in overview and "redrive.DeserializationError" in overview
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
