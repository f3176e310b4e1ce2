"""Kafka headers as JSON, losslessly: how the Spark scheduler keeps them in its state.

A header list goes in and comes out byte for byte: a JSON list of ``[name, base64
value or null]``. PostgreSQL's jsonb cannot hold a NUL character, so a name containing
one (only a forged message would) is stored base64-encoded, with a third element
``"b64"``: the retry service's store used this format in a jsonb column up to schema
version 6 (it now packs headers with MessagePack, ``service/store/packed_headers.py``,
and migration 007 converted the rows written before).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from redrive.headers import Header


def headers_as_json(headers: Sequence[Header]) -> list[list[str | None]]:
    """Headers as JSON-ready lists (see the module docstring for the format)."""
    items: list[list[str | None]] = []
    for name, value in headers:
        encoded = None if value is None else base64.b64encode(value).decode()
        if "\x00" in name:
            items.append([base64.b64encode(name.encode()).decode(), encoded, "b64"])
        else:
            items.append([name, encoded])
    return items


def headers_to_json(headers: Sequence[Header]) -> str:
    """:func:`headers_as_json` as JSON text."""
    return json.dumps(headers_as_json(headers))


def headers_from_json(stored: Any) -> list[Header]:
    """Headers back from JSON text, or from the lists it decodes to (as psycopg hands
    over a jsonb column)."""
    items = json.loads(stored) if isinstance(stored, str | bytes) else stored
    headers: list[Header] = []
    for item in items:
        name = base64.b64decode(item[0]).decode() if len(item) > 2 else item[0]
        headers.append((name, None if item[1] is None else base64.b64decode(item[1])))
    return headers
