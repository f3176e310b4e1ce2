"""What a dead-letter dialect is to ingest: its headers, its mark, its reader."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeAlias

from redrive.headers import Header
from redrive.requests import Incoming
from redrive.service.ingest.reading import Fields

Recognised: TypeAlias = Literal[
    "spring-retry-topic", "spring", "connect", "streams", "share-group", "redrive", "raw"
]


@dataclass(frozen=True, slots=True)
class Dialect:
    """One system's way of writing dead letters."""

    name: Recognised
    is_metadata: Callable[[str], bool]
    """A header this system writes about the failure (not the record's own): kept out
    of the letter's headers, so that a replay delivers the original record."""
    marks: Callable[[str], bool]
    """A header name only this system writes: ``auto`` reads a record that has one in
    this dialect (the dialects are tried in :data:`redrive.service.ingest.DIALECTS` order)."""
    read: Callable[[list[Header], Incoming], Fields]
    """The letter's fields from its metadata headers (and the record read)."""


def where(incoming: Incoming) -> str:
    return f"{incoming.topic}[{incoming.partition}]@{incoming.offset}"
