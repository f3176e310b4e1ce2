"""Processes the local stack starts: pid files, port checks, stopping by pid.

A pid file records the pid and the process's start time, so `down` never signals a
process that merely reuses a recorded pid after a reboot or a crash.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

import psutil


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


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True if something already listens on host:port (we could not bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free now (for tests and `--port 0`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def listener_of(port: int) -> str:
    """Describe who listens on a port, for error messages ('pid 123 (java)')."""
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                if conn.pid:
                    with contextlib.suppress(psutil.Error):
                        return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
                return "another process"
    except psutil.Error:
        pass
    return "another process"
