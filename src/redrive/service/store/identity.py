"""The store's identity: the random id migration 011 made for this database.

A copy of the database (a restored backup) keeps it: it is the same store, moved.
"""

from __future__ import annotations

from typing import Any

import psycopg


def store_id(conn: psycopg.Connection[Any]) -> str:
    """This database's store id, 32 hex digits."""
    row = conn.execute("SELECT store_id FROM redrive_store").fetchone()
    if row is None:  # the migration inserts it: only a hand-edited table lacks it
        raise RuntimeError("redrive_store has no row: the store has no identity")
    return str(row[0].hex)
