"""What a dead-letter dialect is to ingest: its headers, its mark, its reader."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from redrive.header_fields import FailureHistory
from redrive.headers import Header
from redrive.requests import Incoming
from redrive.service.ingest.reading import Fields, Meta, failure

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


def described(
    m: Meta,
    incoming: Incoming,
    what: str,
    history: FailureHistory,
    *,
    about: str = "",
    **more: Any,
) -> Fields:
    """A dialect's fields, its reason said the one way: which system made the letter
    (``what``, ``about`` it), where it was read, and what failed."""
    failure_text = failure(history.error_type, history.error_message)
    return Fields(
        reason=f"{what}{about} ingested from {where(incoming)}{failure_text}",
        topic=history.original_topic,
        history=history,
        unreadable=tuple(m.unreadable),
        **more,
    )
