"""What the Spark commands print: their own lines and Spark's warnings and errors, not
the banners of the processes Spark starts.

The JVM and the Python processes it starts write to the command's standard output and
error themselves, past Python's ``sys.stdout``: the JVM announces an incubator module
it was told to load, and PySpark's driver-side runner of ``transformWithState`` prints
five lines (and as many blank ones) each time a query starts. :func:`quiet_console`
puts a pipe in front of the two file descriptors for as long as the command runs, and
a thread copies every line through but those (:func:`is_banner`), and the reports
of Spark threads that a stop interrupted (:func:`is_interrupted_thread`, printed by
the JVM past its loggers), so that nothing else is held back or reordered on its
stream.
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


def is_interrupted_thread(line: str) -> bool:
    """The JVM's report of a thread that died of an interruption: what a stop does to
    Spark's own threads (a state server's listener, say), printed past any logger."""
    return line.startswith('Exception in thread "') and "Interrupt" in line


def is_stack_line(line: str) -> bool:
    return line.startswith(("\tat ", "\t... ", "Caused by: "))


class _Filter:
    """Which lines to keep, one after another: not the banners and the blank line
    each is followed by, not an interrupted thread's report and its stack."""

    def __init__(self) -> None:
        self.after_banner = False
        self.in_stack = False

    def keep(self, line: str) -> bool:
        if self.in_stack and is_stack_line(line):
            return False
        self.in_stack = is_interrupted_thread(line)
        if self.in_stack:
            return False
        if is_banner(line) or (self.after_banner and not line.strip()):
            self.after_banner = is_banner(line)
            return False
        self.after_banner = False
        return True


def _copy(source: int, target: int) -> None:
    """Copy the lines from ``source`` to ``target`` that :class:`_Filter` keeps, until
    end of file."""
    kept = _Filter()
    with open(source, "rb", buffering=0, closefd=True) as lines:
        pending = b""
        while chunk := lines.read(65536):
            pending += chunk
            *complete, pending = pending.split(b"\n")
            out = [raw + b"\n" for raw in complete if kept.keep(raw.decode(errors="replace"))]
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
