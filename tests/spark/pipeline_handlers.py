"""Handlers that tests/spark/test_pipeline_command.py names on the command line, as
`tests.spark.pipeline_handlers:handle`: the command imports them by name, and so do
Spark's Python workers (from the current directory, the repository's root).

The record's value says what happens: ``declined`` fails with :class:`Declined`
(retried with ``--retry-on``), ``broken`` with ``ValueError`` (fatal with
``--fatal-on``), anything else succeeds.
"""

from __future__ import annotations

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
