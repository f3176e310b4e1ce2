"""Processes the local stack starts: pid files, port checks, stopping by pid.

A pid file records the pid and the process's start time, so `down` never signals a
process that merely reuses a recorded pid after a reboot or a crash.
"""

from __future__ import annotations

import contextlib
import json
import signal
from dataclasses import dataclass
from pathlib import Path

import psutil

# The port checks live in the core (the service checks its HTTP port too); re-exported
# here for the stack's modules.
from redrive.ports import free_port as free_port
from redrive.ports import listener_of as listener_of
from redrive.ports import port_in_use as port_in_use


@dataclass(frozen=True)
class PidRecord:
    pid: int
    create_time: float

    def process(self) -> psutil.Process | None:
        """The recorded process if it still runs (and is the same one), else None."""
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) > 1.0:
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except psutil.Error:
            return None

    def alive(self) -> bool:
        return self.process() is not None


def write_pid(path: Path, pid: int) -> PidRecord:
    record = PidRecord(pid=pid, create_time=psutil.Process(pid).create_time())
    path.write_text(json.dumps({"pid": record.pid, "create_time": record.create_time}))
    return record


def read_pid(path: Path) -> PidRecord | None:
    try:
        data = json.loads(path.read_text())
        return PidRecord(pid=int(data["pid"]), create_time=float(data["create_time"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def stop_process(
    record: PidRecord, *, sig: signal.Signals = signal.SIGTERM, timeout: float = 30.0
) -> bool:
    """Signal the recorded process, wait for it, kill it if it will not go. True if it ran."""
    proc = record.process()
    if proc is None:
        return False
    with contextlib.suppress(psutil.NoSuchProcess):
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except psutil.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return True


class LocalServer:
    """A server the local stack started, known by the pid file and log file in its
    folder: whether it runs, how to stop it, the end of its log.

    Stopping goes by the recorded pid (and start time), never by port or name, so
    `down` stops only what this folder started.
    """

    pid_file: Path
    log_file: Path
    stop_signal: signal.Signals = signal.SIGTERM
    """What asks this server to shut down cleanly."""

    def pid_record(self) -> PidRecord | None:
        return read_pid(self.pid_file)

    def running(self) -> bool:
        record = self.pid_record()
        return record is not None and record.alive()

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the server this folder started. True if it ran."""
        record = self.pid_record()
        stopped = record is not None and stop_process(record, sig=self.stop_signal, timeout=timeout)
        self.pid_file.unlink(missing_ok=True)
        return stopped

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
