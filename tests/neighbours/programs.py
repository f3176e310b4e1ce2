"""Running one neighbour program: its events, its log, and its end.

A program prints its events on standard output, one JSON object a line; everything
else its JVM says (standard error, and any line of standard output that is not an
event) goes to its log file, never to the console. :func:`neighbour` starts a program
against a broker and always stops it on the way out, also when the test fails.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from redrive.deadlines import Deadline
from redrive.local.java import find_java
from tests.neighbours.build import MAIN_CLASS, classpath

Event = dict[str, Any]
STOP_GRACE_S = 20.0
"""A quiet machine's seconds a program has to stop cleanly after SIGTERM."""


class Neighbour:
    """One running program: the events it printed so far, and waits for more."""

    def __init__(self, name: str, process: subprocess.Popen[bytes], log_file: Path) -> None:
        self.name = name
        self.process = process
        self.log_file = log_file
        self._events: list[Event] = []
        self._changed = threading.Condition()

    def events(self, name: str | None = None) -> list[Event]:
        with self._changed:
            return [e for e in self._events if name is None or e.get("event") == name]

    def wait_for(
        self,
        name: str,
        *,
        count: int = 1,
        where: Callable[[Event], bool] = lambda _: True,
        timeout_s: float = 60.0,
    ) -> list[Event]:
        """The first `count` events called `name` that satisfy `where`, once printed."""
        deadline = Deadline(timeout_s)
        while True:
            with self._changed:
                found = [e for e in self._events if e.get("event") == name and where(e)]
                if len(found) >= count:
                    return found[:count]
                exited = self.process.poll()
                if exited is None and not deadline.passed():
                    self._changed.wait(0.2)
                    continue
            if exited is not None:
                what = f"the program exited with code {exited}"
            else:
                what = f"not within {deadline.describe()}"
            raise AssertionError(
                f"{self.name}: {len(found)} of {count} {name!r} events, {what}.\n"
                f"last events: {self.events()[-20:]}\n"
                f"log ({self.log_file}):\n{self.log_tail()}"
            )

    def wait_exit(self, timeout_s: float = 60.0) -> int:
        """The program's exit code, once it ended by itself."""
        deadline = Deadline(timeout_s)
        while (code := self.process.poll()) is None:
            if deadline.passed():
                raise AssertionError(f"{self.name} still runs after {deadline.describe()}")
            time.sleep(0.1)
        return code

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def read(self, stdout: IO[bytes], log: IO[bytes]) -> None:
        """(The reader thread) Events into the list, anything else into the log."""
        for raw in stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                event = None
            if not isinstance(event, dict):
                log.write(b"[stdout] " + raw)
                log.flush()
                continue
            with self._changed:
                self._events.append(event)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()


@contextmanager
def neighbour(program: str, bootstrap: str, *args: str, log_dir: Path) -> Iterator[Neighbour]:
    """Run `program` (a name Main dispatches on) against `bootstrap` with `args`; its
    log is `<log_dir>/<program>.log`. The program is built first if it never was."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / f"{program}.log"
    cmd = [
        find_java(),
        "-Xmx384m",
        # Short runs on a small machine: a fast start matters more than peak speed.
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseSerialGC",
        "-Djava.awt.headless=true",
        "-cp",
        classpath(),
        MAIN_CLASS,
        program,
        bootstrap,
        *args,
    ]
    with open(log_file, "ab") as log:
        process = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, cwd=log_dir
        )
        running = Neighbour(program, process, log_file)
        assert process.stdout is not None
        reader = threading.Thread(
            target=running.read, args=(process.stdout, log), name=f"{program}-events", daemon=True
        )
        reader.start()
        try:
            yield running
        finally:
            _stop(process)
            reader.join(timeout=10)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the programs' shutdown hooks leave their groups cleanly), then SIGKILL."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        deadline = Deadline(STOP_GRACE_S)
        while process.poll() is None and not deadline.passed():
            time.sleep(0.1)
        if process.poll() is None:
            process.kill()
    process.wait(timeout=30)
