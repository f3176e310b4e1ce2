"""What the Spark commands' console keeps (redrive.spark.console): the command's own
lines and Spark's warnings, not the banners nor a stop's interrupted threads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

PRINTED = """\
redrive spark scheduler: kafka 127.0.0.1:9092, requests topic r, checkpoint c
WARNING: Using incubator modules: jdk.incubator.vector
Starting Streaming TransformWithStateInPandas Python worker.

Streaming TransformWithStateInPandas Python worker finish init stage of Python runner.

26/11/27 13:45:08 WARN ProcessingTimeExecutor: Current batch is falling behind.
Exception in thread "stateConnectionListenerThread" java.nio.channels.ClosedByInterruptException
\tat java.base/java.nio.channels.spi.AbstractInterruptibleChannel.end(Channel.java:199)
\tat java.base/java.lang.Thread.run(Thread.java:840)
Caused by: java.lang.InterruptedException
\t... 3 more
Exception in thread "main" java.lang.IllegalStateException: a real one
\tat org.example.Main.main(Main.java:1)

redrive spark scheduler: stopped
"""

KEPT = """\
redrive spark scheduler: kafka 127.0.0.1:9092, requests topic r, checkpoint c
26/11/27 13:45:08 WARN ProcessingTimeExecutor: Current batch is falling behind.
Exception in thread "main" java.lang.IllegalStateException: a real one
\tat org.example.Main.main(Main.java:1)

redrive spark scheduler: stopped
"""

# A child process writing straight to its file descriptors, as the JVM does.
PROGRAM = f"""
import os, sys
from redrive.spark.console import quiet_console
with quiet_console():
    os.write(2, {PRINTED!r}.encode())
"""


def test_the_console_keeps_what_a_user_reads_and_drops_the_rest() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ},
    )
    assert result.stderr == KEPT
