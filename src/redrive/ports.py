"""Local TCP ports: is one taken, who holds it, which one is free.

The service checks its HTTP port before it starts anything, so that a port already in
use is a start-up error naming the setting and the process that holds it, not a
uvicorn traceback after Kafka and PostgreSQL are connected. The dev stack uses the same
checks for its broker and database.
"""

from __future__ import annotations

import socket


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
