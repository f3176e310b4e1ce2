"""A record of a foreign dead-letter topic, as a redrive dead letter: :func:`ingest`.

Intake reads dead-letter topics written by other systems (the ``ingest`` setting) and
stores each record as a :class:`~redrive.records.DeadLetterRecord`. Each system's way
of writing dead letters is a :class:`~.dialect.Dialect` in a module of its own:

- ``spring-retry-topic``: Spring Kafka's retry topics' DLT (:mod:`.spring_retry_topic`);
- ``spring``: Spring Kafka's ``DeadLetterPublishingRecoverer`` (:mod:`.spring`);
- ``connect``: Kafka Connect's dead-letter queue (:mod:`.connect`);
- ``streams``: Kafka Streams' dead-letter queue, KIP-1034 (:mod:`.streams`);
- ``share-group``: a share group's dead-letter queue, KIP-1191 (:mod:`.share_group`);
- ``redrive``: redrive's own ``<topic>.dlq`` (:mod:`.redrive_letters`);
- ``raw``: a record without metadata (:mod:`.raw`).

``auto`` reads a record in the first of those (in that order) one of whose headers
only that system writes, else ``raw``.

The contract of :func:`ingest`:

- key and value verbatim; headers the record's own minus the dialect's metadata
  headers, in order and byte for byte, so that a replay delivers the original record;
- ``topic`` (where a replay goes) the original topic the metadata names, when it is a
  legal topic name (redrive: the destination); None when there is none (raw, or
  unreadable);
- a value that cannot be read (wrong size, not a number, negative or out of range,
  not UTF-8, not a topic name) is dropped, and the reason says so
  (``; kafka_dlt-original-offset unreadable``); a null value counts as absent;
- ``reason_code`` :attr:`~DeadLetterReason.INGESTED` (redrive's own: see its module);
  ``source`` ``ingest:<dialect read>``; ``request`` the record's own coordinates (the
  store's unique index on them makes ingest idempotent);
- a letter that holds no copy of its record (a share group's, by default) says
  :attr:`IngestedLetter.needs_record`: intake reads the record from its topic
  (:mod:`.originals`);
- it never raises, whatever the headers, keys and values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, TypeAlias, get_args

from redrive.headers import Header, read_replay
from redrive.records import DeadLetterRecord
from redrive.requests import Incoming
from redrive.service.ingest import (
    connect,
    raw,
    redrive_letters,
    share_group,
    spring,
    spring_retry_topic,
    streams,
)
from redrive.service.ingest.dialect import Dialect, Recognised
from redrive.service.ingest.reading import short

DIALECTS: Final[tuple[Dialect, ...]] = (
    spring_retry_topic.DIALECT,
    spring.DIALECT,
    connect.DIALECT,
    streams.DIALECT,
    share_group.DIALECT,
    redrive_letters.DIALECT,
    raw.DIALECT,
)
"""Every dialect, in the order ``auto`` tries them (raw last: it marks nothing)."""
_BY_NAME: Final = {dialect.name: dialect for dialect in DIALECTS}

Format: TypeAlias = Literal["auto", Recognised]
FORMATS: Final[tuple[Format, ...]] = ("auto", *get_args(Recognised))

__all__ = ["DIALECTS", "FORMATS", "Format", "IngestedLetter", "Recognised", "ingest", "recognise"]


@dataclass(frozen=True, slots=True)
class IngestedLetter:
    """A record of a dead-letter topic, read as ``format``, and its dead letter."""

    format: Recognised
    letter: DeadLetterRecord
    needs_record: bool = False
    """The letter holds no copy of its record: its key, value and headers are to be
    read from the original topic, at the letter's original coordinates."""


def ingest(incoming: Incoming, format: Format) -> IngestedLetter:
    """The dead letter a record of a dead-letter topic becomes (see the module).

    ``format`` is one of :data:`FORMATS` (the service's settings check it).
    """
    headers = list(incoming.headers or ())
    dialect = _BY_NAME[recognise(headers) if format == "auto" else format]
    meta: list[Header] = []
    user: list[Header] = []
    for item in headers:  # anything else than a named pair is no metadata: kept as is
        (meta if _is_named(item) and dialect.is_metadata(item[0]) else user).append(item)
    fields = dialect.read(meta, incoming)
    reason = fields.reason
    if fields.unreadable:
        reason += "".join(f"; {name} unreadable" for name in fields.unreadable)
    if incoming.header_problem is not None:
        problem = short(str(incoming.header_problem))
        reason += f"; headers partly unreadable: {problem}"
    history = fields.history.failure_history()
    # A foreign system keeps a record's headers: a replayed letter's round survives it.
    if history["replays"] is None and (replay := read_replay(headers)) is not None:
        history["replays"], history["replay_of"] = replay
    letter = DeadLetterRecord(
        topic=fields.topic,
        key=incoming.key,
        value=incoming.value,
        headers=user,
        reason_code=fields.code,
        reason=reason,
        source=f"ingest:{dialect.name}",
        attempt=fields.attempt,
        request=incoming.coordinates,
        **history,
    )
    return IngestedLetter(dialect.name, letter, fields.needs_record)


def recognise(headers: list[Header] | tuple[Header, ...]) -> Recognised:
    """The dialect ``auto`` reads a record's headers in."""
    names = [item[0] for item in headers if _is_named(item)]
    for dialect in DIALECTS:
        if any(map(dialect.marks, names)):
            return dialect.name
    return "raw"


def _is_named(item: object) -> bool:
    """A header as confluent-kafka gives it: a pair with a str name."""
    return type(item) is tuple and len(item) == 2 and isinstance(item[0], str)
