"""Values between Python and the store's columns, both ways.

In: text for a display column, which PostgreSQL cannot store with a NUL in it, and
row ids as one array. Out: rows as dicts, their headers unpacked and their key and
value as bytes, which the reads make into their values (:mod:`.read_models`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeAlias

from redrive.service.store.packed_headers import unpack_headers

Row: TypeAlias = dict[str, Any]
"""One row as a dict of column name to value."""


def clean_text(text: str | None) -> str | None:
    """Text for a PostgreSQL text column, which cannot hold NUL: NUL becomes U+FFFD.

    Only display columns go through this; the raw headers are kept losslessly.
    """
    return None if text is None else text.replace("\x00", "\ufffd")


def id_array(ids: Iterable[int]) -> str:
    """Row ids as a PostgreSQL array literal, for ``= ANY(%s::bigint[])``.

    psycopg dumps a list of ints one element at a time in Python, choosing a size for
    each: 0.7-1.0 us of the client's CPU an id, on the scheduler's path for every
    delivered retry. The literal is joined in C: 0.15-0.22 us an id, measured the
    same way (PostgreSQL parses an array sent either way).
    """
    return "{" + ",".join(map(str, ids)) + "}"


def decoded(rows: list[Row]) -> list[Row]:
    """Rows as callers use them: headers as a header list, key and value as bytes."""
    for row in rows:
        row["headers"] = unpack_headers(row["headers"])
        for name in ("msg_key", "msg_value"):
            if row.get(name) is not None:
                row[name] = bytes(row[name])
    return rows
