"""Schema migrations: numbered SQL files applied once each, in order.

Each file in `schema/` (`NNN_name.sql`) runs in its own transaction and is
recorded in `redrive_schema_migrations`. A transaction-level advisory lock makes
concurrent starters (several `redrive serve` at once) apply each migration exactly
once. Migrations only move forward; a database newer than this code is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import structlog

from redrive.errors import ConfigError

log = structlog.get_logger(__name__)

MIGRATIONS_DIR = Path(__file__).parent / "schema"
_LOCK_ID = 0x72656472  # "redr": one advisory lock for all redrive migrations
_NAME = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def available() -> list[Migration]:
    found = []
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        match = _NAME.match(path.name)
        if not match:
            raise RuntimeError(f"migration file {path.name} does not match NNN_name.sql")
        found.append(Migration(int(match.group(1)), path.stem, path.read_text()))
    return found


Step = Callable[[psycopg.Connection[Any]], None]


def migrate(
    conn: psycopg.Connection[Any],
    *,
    up_to: int | None = None,
    after: Mapping[int, Step] | None = None,
) -> list[str]:
    """Apply the migrations this database lacks (those numbered up to `up_to` only, if
    given: upgrade tests start from an older schema); returns the names applied.
    ``after`` holds what a migration needs done in Python (filling a new column from
    data SQL cannot compute), run in that migration's transaction."""
    applied: list[str] = []
    with conn.transaction():
        conn.execute(
            "CREATE TABLE IF NOT EXISTS redrive_schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
    migrations = available()
    newest_known = migrations[-1].version if migrations else 0
    for migration in migrations:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_ID,))
            row = conn.execute("SELECT max(version) FROM redrive_schema_migrations").fetchone()
            current = row[0] if row and row[0] is not None else 0
            if current > newest_known:
                raise ConfigError(
                    "database schema",
                    f"the database is at schema version {current}, newer than this "
                    f"redrive knows ({newest_known})",
                    "upgrade redrive, or point it at another database",
                )
            if migration.version <= current or (up_to is not None and migration.version > up_to):
                continue
            conn.execute(migration.sql.encode())
            if after is not None and migration.version in after:
                after[migration.version](conn)
            conn.execute(
                "INSERT INTO redrive_schema_migrations (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied.append(migration.name)
            log.info("schema migration applied", migration=migration.name)
    return applied
