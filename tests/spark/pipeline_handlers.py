"""Handlers that tests/spark/test_pipeline_command.py names on the command line, as
`tests.spark.pipeline_handlers:handle`: the command imports them by name, and so do
Spark's Python workers (from the current directory, the repository's root).

The record's value says what happens: ``declined`` fails with :class:`Declined`
(retried with ``--retry-on``), ``broken`` with ``ValueError`` (fatal with
``--fatal-on``), anything else succeeds.
"""

from __future__ import annotations

import os
import time

from redrive.headers import Header


class Declined(Exception):
    """Worth retrying."""


def handle(key: bytes | None, value: bytes | None, headers: list[Header], attempt: int) -> bytes:
    text = (value or b"").decode()
    if text == "declined":
        raise Declined(f"declined at attempt {attempt}")
    if text == "broken":
        raise ValueError("broken record")
    return f"handled {text} at attempt {attempt}".encode()


async def handle_async(
    key: bytes | None, value: bytes | None, headers: list[Header], attempt: int
) -> bytes:
    """What the Spark pipeline cannot run: calling it only makes a coroutine."""
    return value or b""


NOT_A_FUNCTION = "a string"


CALLS_FILE = "PIPELINE_TEST_CALLS"
"""Environment variable: a file where :func:`handle_slowly` notes each call."""


def handle_slowly(
    key: bytes | None, value: bytes | None, headers: list[Header], attempt: int
) -> bytes:
    """Notes each call (``value attempt``, a line) in the file named by
    :data:`CALLS_FILE`, then takes 30 ms, so that a batch is seen running and can be
    stopped half done. ``retry-*`` fails its first attempt, ``dead-*`` every one
    (fatally, as ``broken``); anything else succeeds."""
    text = (value or b"").decode()
    with open(os.environ[CALLS_FILE], "a") as calls:
        calls.write(f"{text} {attempt}\n")
    time.sleep(0.03)
    if text.startswith("retry-") and attempt == 1:
        raise Declined(f"declined at attempt {attempt}")
    if text.startswith("dead-"):
        raise ValueError("broken record")
    return f"handled {text} at attempt {attempt}".encode()
