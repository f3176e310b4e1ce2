"""Local TCP ports: is one taken, who holds it, which one is free.

The service checks its HTTP port before it starts anything, so that a port already in
use is a start-up error naming the setting and the process that holds it, not a
uvicorn traceback after Kafka and PostgreSQL are connected. The dev stack uses the same
checks for its broker and database.
"""

from __future__ import annotations

import random
import socket
from collections import deque
from pathlib import Path
from typing import Final


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True if something already listens on host:port (we could not bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


EPHEMERAL_RANGE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_CHOSEN: Final = 10_000
"""The lowest port :func:`free_port` chooses: above the ports services are known by."""

_given: deque[int] = deque(maxlen=256)
"""Ports this process handed out lately: not handed out twice before they are bound."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now (for tests and `--port 0`), chosen below the kernel's ephemeral
    range where the range can be read.

    A port the kernel picks (a bind to port 0) comes from that range, which every
    process's bind to port 0 and every outgoing connection draw from too. Between this
    answer and the server's own bind (a broker's JVM binds seconds later) another
    process could take it. Below the range, only a process asking for that very port
    can."""
    below = ephemeral_low()
    if below is not None and below - LOWEST_CHOSEN > 1_000:
        for _ in range(100):
            port = random.randrange(LOWEST_CHOSEN, below)  # noqa: S311 - a port, not a secret
            if port not in _given and not port_in_use(port, host):
                _given.append(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def ephemeral_low() -> int | None:
    """The lowest port of the kernel's ephemeral range, None where it cannot be read."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def listener_of(port: int) -> str:
    """Describe who listens on a port, for error messages ('pid 123 (java)').

    psutil comes with the service extra; without it (or without the right to see other
    users' sockets) the answer is "another process".
    """
    try:
        import psutil
    except ImportError:
        return "another process"
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                if conn.pid:
                    try:
                        return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
                    except psutil.Error:
                        pass
                return "another process"
    except psutil.Error:
        pass
    return "another process"
