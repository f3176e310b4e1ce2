"""API tokens: names, roles and SHA-256 digests (the tokens themselves are never kept)."""

from __future__ import annotations

from typing import Any

import psycopg


def insert(conn: psycopg.Connection[Any], name: str, role: str, digest: str) -> bool:
    """Store a new token; False (nothing written) if a token of that name exists."""
    return bool(
        conn.execute(
            "INSERT INTO redrive_api_tokens (name, role, token_hash) VALUES (%s, %s, %s) "
            "ON CONFLICT (name) DO NOTHING",
            (name, role, digest),
        ).rowcount
    )


def revoke(conn: psycopg.Connection[Any], name: str) -> bool:
    """Mark the named token revoked; False if there is no live token of that name."""
    return bool(
        conn.execute(
            "UPDATE redrive_api_tokens SET revoked_at = now() "
            "WHERE name = %s AND revoked_at IS NULL",
            (name,),
        ).rowcount
    )


def listed(conn: psycopg.Connection[Any]) -> list[tuple[str, str, object, object]]:
    """(name, role, created_at, revoked_at) of every token, by name."""
    rows = conn.execute(
        "SELECT name, role, created_at, revoked_at FROM redrive_api_tokens ORDER BY name"
    ).fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def live_by_digest(conn: psycopg.Connection[Any], digest: str) -> tuple[str, str, str] | None:
    """(name, role, digest) of the live token with this digest, if any."""
    row = conn.execute(
        "SELECT name, role, token_hash FROM redrive_api_tokens "
        "WHERE token_hash = %s AND revoked_at IS NULL",
        (digest,),
    ).fetchone()
    return None if row is None else (row[0], row[1], row[2])
