"""What the Spark commands print: their own lines and Spark's warnings and errors, not
the banners of the processes Spark starts.

The JVM and the Python processes it starts write to the command's standard output and
error themselves, past Python's ``sys.stdout``: the JVM announces an incubator module
it was told to load, and PySpark's driver-side runner of ``transformWithState`` prints
five lines (and as many blank ones) each time a query starts. :func:`quiet_console`
puts a pipe in front of the two file descriptors for as long as the command runs, and
a thread copies every line through but those (:func:`is_banner`), so that nothing
else is held back or reordered on its stream.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Final

BANNERS: Final = (
    "WARNING: Using incubator modules:",
    "Starting Streaming TransformWithStateInPandas Python worker",
    "Streaming TransformWithStateInPandas Python worker",
)
"""How the lines begin that say nothing to a user of the commands."""


def is_banner(line: str) -> bool:
    return line.startswith(BANNERS)


def _copy(source: int, target: int) -> None:
    """Copy lines from ``source`` to ``target`` until end of file, without banners and
    the blank line each banner is followed by."""
    after_banner = False
    with open(source, "rb", buffering=0, closefd=True) as lines:
        pending = b""
        while chunk := lines.read(65536):
            pending += chunk
            *complete, pending = pending.split(b"\n")
            out = []
            for raw in complete:
                text = raw.decode(errors="replace")
                if is_banner(text) or (after_banner and not text.strip()):
                    after_banner = is_banner(text)
                    continue
                after_banner = False
                out.append(raw + b"\n")
            if out:
                os.write(target, b"".join(out))
        if pending:
            os.write(target, pending)


@contextlib.contextmanager
def quiet_console() -> Iterator[None]:
    """Standard output and error without the banners, for the ``with`` block (and the
    processes started in it)."""
    saved: list[tuple[int, int, threading.Thread]] = []
    try:
        for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
            stream.flush()
            original = os.dup(fd)
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            copier = threading.Thread(
                target=_copy, args=(read_end, original), name=f"console-{fd}", daemon=True
            )
            copier.start()
            saved.append((fd, original, copier))
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        for fd, original, copier in saved:
            os.dup2(original, fd)  # the pipe's last writer here: the copier sees its end
            copier.join(2.0)  # unless a child process keeps the pipe open
            if not copier.is_alive():
                os.close(original)
