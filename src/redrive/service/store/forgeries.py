"""A forgery found as intake stores a batch: another request under an accepted identity.

A request's identity (its ``redrive-id``) says which request it is; its content
(:func:`redrive.requests.content_of`: its key, its value and whether a key of ours
vouched for its sender) says what it carries. A copy (a sender repeating a hand-off
after a crash, intake reading again what it had not committed) has both the same, and
is dropped as a repeat. A request under an accepted identity with other content is not
a copy: someone wrote another record, or an unsigned copy of a signed request, under
an id that is not theirs. It is refused, as a dead letter of its own, and the accepted
request stays as it was.

Invariant: a forgery's letter is under an identity of its own, where it was read
(:func:`redrive.requests.read_at_identity`), never the one it claims, and keeps the
request whole (its key, value and headers as they came).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from redrive.headers import HeaderError, decode
from redrive.reasons import DeadLetterReason
from redrive.records import DeadLetterRecord, PendingRetry, Release, RequestCoordinates
from redrive.requests import FORGED, SOURCE, Incoming, read_at_identity

Accepted = PendingRetry | DeadLetterRecord | Release


def reason(claimed: bytes) -> str:
    """Why a forgery claiming ``claimed`` is refused: a dead letter's ``reason``."""
    return (
        f"{FORGED} ({claimed.hex()}): not a copy of it (another key, value or sender); "
        "the accepted one stands"
    )


def differs(accepted: bytes | None, content: bytes | None) -> bool:
    """Whether a request of ``content`` under an identity accepted with ``accepted`` is
    another request (a forgery): only when both are known (None: an identity accepted
    before contents were kept, or a record that does not say) and they differ."""
    return accepted is not None and content is not None and accepted != content


def letters_of(forged: Sequence[Accepted], read: Sequence[Incoming]) -> list[DeadLetterRecord]:
    """The dead letters of the ``forged`` records of a batch whose messages are ``read``
    (where a release, which keeps none of its message, is found)."""
    releases = any(isinstance(record, Release) for record in forged)
    messages = {message.coordinates: message for message in read} if releases else {}
    return [_letter_of(record, messages) for record in forged]


def _letter_of(
    record: Accepted, messages: Mapping[RequestCoordinates, Incoming]
) -> DeadLetterRecord:
    """The dead letter of one forged record."""
    assert record.identity is not None  # a request's: read somewhere, with an identity
    assert record.request is not None
    why = reason(record.identity)
    own = read_at_identity(record.request)
    if isinstance(record, DeadLetterRecord):  # a letter its sender asked for: kept whole
        return dataclasses.replace(
            record,
            reason_code=DeadLetterReason.INVALID_SIGNATURE,
            reason=why,
            source=SOURCE,
            identity=own,
        )
    if isinstance(record, PendingRetry):
        key, value, headers = record.key, record.value, record.headers
        topic: str | None = record.destination
        # What it says of its failure, should its headers not decode (they did once).
        known: dict[str, Any] = {
            "group": record.group,
            "original_topic": record.original_topic,
            "original_partition": record.original_partition,
            "original_offset": record.original_offset,
        }
    else:
        message = messages.get(record.request)
        key, value, headers = (
            (None, None, []) if message is None else (message.key, message.value, message.headers)
        )
        topic, known = None, {"original_offset": record.original_offset}
    letter = DeadLetterRecord(
        topic=topic,
        key=key,
        value=value,
        headers=headers,
        reason_code=DeadLetterReason.INVALID_SIGNATURE,
        reason=why,
        source=SOURCE,
        attempt=record.attempt,
        request=record.request,
        identity=own,
        content=record.content,
        **known,
    )
    try:
        request, _ = decode(headers)  # decoded once by classify: they decode
    except HeaderError:
        return letter
    return dataclasses.replace(
        letter, topic=request.destination, attempt=request.attempt, **request.failure_history()
    )
