"""A record without dead-letter metadata: kept as it is, with nowhere to go."""

from __future__ import annotations

from typing import Final

from redrive.headers import Header
from redrive.requests import Incoming
from redrive.service.ingest import reading as r
from redrive.service.ingest.dialect import Dialect, where


def _read(meta: list[Header], incoming: Incoming) -> r.Fields:
    return r.Fields(reason=f"record without dead-letter metadata ingested from {where(incoming)}")


def _never(name: str) -> bool:
    return False


DIALECT: Final = Dialect(name="raw", is_metadata=_never, marks=_never, read=_read)
