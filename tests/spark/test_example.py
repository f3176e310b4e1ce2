"""examples/spark_pipeline.py runs as its docstring says: `--with-scheduler`, orders in,
charges out, a declined order charged on its second attempt after the Spark scheduler
brought it back, a value that is not JSON a dead letter; SIGTERM stops it cleanly.

The example's topics are prefixed (EXAMPLE_TOPIC_PREFIX) with a name of this run: the
broker is the whole suite's, and other tests use `orders` too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from redrive.deadlines import Deadline
from tests.integration.service_harness import produce
from tests.spark import TopicReader

pytestmark = pytest.mark.spark

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline.py"


def wait_for_line(log: Path, line: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = Deadline(timeout_s)
    while line not in log.read_text(errors="replace"):
        if process.poll() is not None:
            pytest.fail(f"the example exited ({process.returncode}):\n{tail(log)}")
        if deadline.passed():
            pytest.fail(f"no {line!r} within {deadline.describe()}:\n{tail(log)}")
        time.sleep(0.2)


def tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def test_the_spark_example_charges_retries_and_dead_letters(bootstrap: str, tmp_path: Path) -> None:
    prefix = f"example-{uuid.uuid4().hex[:8]}."
    orders, charged, dlq = f"{prefix}orders", f"{prefix}orders.charged", f"{prefix}redrive.dlq"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDRIVE_", "PYSPARK_"))}
    env.update(
        REDRIVE_BOOTSTRAP=bootstrap,
        EXAMPLE_CHECKPOINT=str(tmp_path / "checkpoint"),
        EXAMPLE_TOPIC_PREFIX=prefix,
    )
    log = tmp_path / "example.log"
    with open(log, "wb") as out:
        example = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--with-scheduler"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    reader: TopicReader | None = None
    try:
        # Once it says so, its topics exist (it creates them) and its queries run.
        wait_for_line(log, f"running on {bootstrap}: {orders} -> {charged}", example, 180)
        produce(
            bootstrap,
            orders,
            [
                {"key": b"1", "value": json.dumps({"id": 1}).encode()},
                {"key": b"2", "value": json.dumps({"id": 2, "declined_until_attempt": 1}).encode()},
                {"key": b"3", "value": b"not json"},
            ],
        )
        reader = TopicReader(bootstrap, [charged, dlq, orders])
        deadline = Deadline(240)
        while len(reader.of(charged)) < 2 or not reader.of(dlq):
            if example.poll() is not None:
                pytest.fail(f"the example exited ({example.returncode}):\n{tail(log)}")
            if deadline.passed():
                pytest.fail(
                    f"not charged and dead-lettered within {deadline.describe()}:\n{tail(log)}"
                )
            reader.poll(0.5)

        results = {m.key: json.loads(m.value or b"") for m in reader.of(charged)}
        assert results == {
            b"1": {"id": 1, "charged": True, "attempts": 1},
            b"2": {"id": 2, "charged": True, "attempts": 2},
        }
        # Order 2 came back on its topic, delivered by the Spark scheduler with the
        # retry's headers: that is how its handler knew it was attempt 2.
        redelivered = [m for m in reader.of(orders) if m.header("redrive-attempt") is not None]
        assert [(m.key, m.header("redrive-attempt")) for m in redelivered] == [(b"2", b"1")]
        (letter,) = reader.of(dlq)
        assert (letter.key, letter.value) == (b"3", b"not json")
        reason = letter.header("redrive-dead-letter-reason")
        assert reason is not None and b"JSONDecodeError" in reason, letter.headers
    finally:
        if reader is not None:
            reader.close()
        example.send_signal(signal.SIGTERM)
        code = example.wait(90)
    assert code == 0, tail(log)
