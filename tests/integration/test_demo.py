"""`make demo DEMO_ONESHOT=1`: the items scenario runs on both engines and checks itself.

The demo runs the scenario with the Python App (``[app]``) and a PySpark Structured
Streaming query built on redrive.spark (``[spark]``, real Spark in local mode), on the
session's real broker and database. What a user relies on is its output: each
engine's update fails before the create, is retried through the retry service and
applied on a later attempt, each engine's malformed event is a dead letter in the
one store and UI, and nothing but the narration reaches the terminal (no Spark or
Java log line, no raw librdkafka line).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import urllib.request

import pytest

from redrive.local import LocalStack

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# What Spark, its JVM, log4j, py4j or librdkafka would print if they reached the
# terminal: Spark's log lines ("25/01/02 10:00:00 WARN NativeCodeLoader: ..."), its
# start-up notices, the JVM's incubator-module warning, Java stack frames, and
# librdkafka's own lines ("%4|1700000000.123|GETPID|...").
NOISE = re.compile(
    r"^\S+ \d{2}:\d{2}:\d{2}(\.\d+)? (TRACE|DEBUG|INFO|WARN|ERROR) "
    r"|log4j|SLF4J|NativeCodeLoader|Using incubator modules|setLogLevel|Setting default log level"
    r"|py4j|org\.apache\.|^\s+at [\w$.]+\(|Exception in thread|^%\d\|",
    re.MULTILINE,
)


def demo_env(local_stack: LocalStack, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDRIVE_", "DEMO_"))}
    env.update(REDRIVE_STATE_DIR=str(local_stack.root), **extra)
    return env


def stopped_within(proc: subprocess.Popen[str], timeout_s: float) -> tuple[str, str]:
    """What the process printed once it stopped; if it has not within ``timeout_s``,
    its threads' stacks are asked for and its whole session killed, and the test fails
    saying where it hung."""
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            rest, err = proc.communicate(timeout=10)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(
            f"still running {timeout_s:.0f} s after Ctrl-C; it printed:\n"
            f"{rest[-2000:]}\n{err[-8000:]}"
        )


def applied_on(engine: str, out: str) -> int:
    """The attempt on which an engine applied the update, from its narration line."""
    found = re.search(
        rf"\[{engine}\]\s+update-item \S+: status set to ACTIVE on attempt (\d+)$",
        out,
        re.MULTILINE,
    )
    assert found, f"no [{engine}] line applying the update:\n{out}"
    return int(found.group(1))


def test_the_demo_in_one_shot_mode_passes_on_both_engines(local_stack: LocalStack) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "redrive.cli", "demo"],
        env=demo_env(local_stack, DEMO_ONESHOT="1"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out, err = result.stdout, result.stderr
    assert result.returncode == 0, out + err
    assert "demo passed" in out
    assert "starting Spark (local[2])" in out

    for engine in ("app", "spark"):
        # Before the create, the item does not exist in this engine's view...
        assert re.search(rf"\[{engine}\]\s+GET /v1/demo/items/\S+ -> 404", out), out
        # ...its update fails and the retry service brings it back...
        assert re.search(
            rf"\[{engine}\]\s+update-item: item \S+ not found \(attempt 1\); "
            r"the retry service brings it back in 2s",
            out,
        ), out
        # ...until the create has been processed: applied on a later attempt.
        assert applied_on(engine, out) > 1
        assert re.search(rf"\[{engine}\]\s+GET /v1/demo/items/\S+ -> 200 .*\"ACTIVE\"", out), out
    assert re.search(
        r"\[app\]\s+it is a dead letter in the retry service's store "
        r"\(redrive\.DeserializationError\)",
        out,
    ), out
    assert re.search(
        r"\[spark\]\s+it is a dead letter in the retry service's store "
        r"\(json\.decoder\.JSONDecodeError\)",
        out,
    ), out
    assert re.search(r"\[spark\]\s+item \S+ is ACTIVE: applied on attempt \d+, after", out), out
    # The address it prints serves the web UI's overview.
    assert "web UI: http://127.0.0.1:" in out

    # Nothing else on the terminal: Spark's and the JVM's output is in its log file.
    assert err == "", err
    assert not NOISE.search(out), NOISE.search(out)
    spark_folder = local_stack.root / "demo" / "spark"
    assert (spark_folder / "spark.log").exists()
    assert not (spark_folder / "checkpoint").exists(), "the query's checkpoint was left behind"


def test_the_ui_address_the_demo_prints_shows_both_dead_letters(local_stack: LocalStack) -> None:
    """As a new user: run the demo, open the address it prints, see the dead letters;
    Ctrl-C stops it cleanly, the Spark query included."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "redrive.cli", "demo"],
        # A demo that hangs on its way out is asked where (SIGABRT: Python's fault
        # handler prints every thread's stack), then stopped with all it started.
        env=demo_env(local_stack, PYTHONFAULTHANDLER="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        url = None
        printed = []
        for line in proc.stdout:
            printed.append(line)
            if line.startswith("web UI: "):
                url = line.removeprefix("web UI: ").strip()
            if "Running until Ctrl-C" in line:
                break
        if url is None:
            proc.wait(60)
            said = "".join(printed[-20:]) + (proc.stderr.read() if proc.stderr else "")
            pytest.fail(f"the demo printed no UI address; it ended with:\n{said}")
        with urllib.request.urlopen(url, timeout=10) as response:
            overview = response.read().decode()
        assert response.status == 200
        assert "Overview" in overview
        assert "redrive.DeserializationError" in overview  # the App's
        assert "JSONDecodeError" in overview  # the Spark query's
    finally:
        proc.send_signal(signal.SIGINT)
        rest, err = stopped_within(proc, 90)
    assert proc.returncode == 0, rest + err
    assert err == "", err
    assert not NOISE.search(rest), rest
    assert not (local_stack.root / "demo" / "spark" / "checkpoint").exists()
