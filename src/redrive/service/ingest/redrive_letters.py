"""redrive's own dead letters: a ``<topic>.dlq`` record of an App, or one mirrored by
the retry service or the Spark scheduler, read with the contract's lenient reader
(:func:`redrive.headers.read_delivery_headers`: of a repeated header the last wins;
redrive writes each once).

The reason code is the one its ``redrive-dead-letter-reason`` names if it is one, else
when its ``redrive-send-to`` is ``dlq`` the one its ``redrive-reason-code`` names
(``fatal_error``, ``attempts_exhausted``, ``deadline_passed``), or ``sent_to_dlq``; the
letter goes back to its destination (as intake does for a consumer's dead letter).
"""

from __future__ import annotations

from typing import Final

from redrive.header_fields import FIELD_OF, FailureHistory
from redrive.headers import (
    ATTEMPT,
    DEAD_LETTER_REASON,
    DESTINATION,
    MAX_ERROR_MESSAGE_BYTES,
    MAX_INT32,
    RETRY_AT,
    SEND_TO,
    SIGNATURE,
    Header,
    RetryHeaders,
    is_redrive_header,
    read_delivery_headers,
)
from redrive.reasons import DeadLetterReason
from redrive.requests import Incoming
from redrive.service.ingest import reading as r
from redrive.service.ingest.dialect import Dialect, where

_CODES: Final = frozenset(code.value for code in DeadLetterReason)


def _read(meta: list[Header], incoming: Incoming) -> r.Fields:
    m = r.Meta(meta)
    # A dead letter's retry-at means nothing: a valid one is put in, so that the
    # reader keeps the rest. Without a usable destination, a stand-in (not kept).
    read = read_delivery_headers([*meta, (RETRY_AT, b"0")])
    has_destination = read is not None
    if read is None:
        read = read_delivery_headers([*meta, (DESTINATION, b"_"), (RETRY_AT, b"0")])
    if read is None:  # not expected: the stand-ins are valid
        read = RetryHeaders(destination="_", retry_at=0)
        has_destination = False
    unreadable = [
        name
        for name in FIELD_OF
        # A signature is its request's, never read from a delivery (nor a letter).
        if name not in (RETRY_AT, DESTINATION, ATTEMPT, SEND_TO, SIGNATURE)
        and m.last.get(name) is not None
        and getattr(read, FIELD_OF[name]) is None
    ]
    if m.last.get(DESTINATION) is not None and not has_destination:
        unreadable.insert(0, DESTINATION)
    attempt = m.get(ATTEMPT, r.decimal(MAX_INT32))  # which notes a value not a number
    if attempt is not None and attempt != read.attempt:  # one the contract refuses
        unreadable.append(ATTEMPT)
        attempt = None
    send_to = m.last.get(SEND_TO)
    if send_to is not None and send_to != read.send_to.encode():
        unreadable.append(SEND_TO)
    said = m.get(DEAD_LETTER_REASON, r.text(MAX_ERROR_MESSAGE_BYTES))
    code = DeadLetterReason.INGESTED
    if said in _CODES:
        code, said = DeadLetterReason(said), None
    elif read.send_to == "dlq":
        given = read.reason_code
        code = DeadLetterReason(given) if given else DeadLetterReason.SENT_TO_DLQ
    why = said or read.reason
    failure = f": {r.short(why)}" if why else r.failure(read.error_type, read.error_message)
    what = "redrive dead letter" if m else "record without redrive- headers"
    return r.Fields(
        reason=f"{what} ingested from {where(incoming)}{failure}",
        code=code,
        topic=read.destination if has_destination else read.original_topic,
        attempt=attempt,
        history=FailureHistory(**read.failure_history()),
        unreadable=(*unreadable, *m.unreadable),
    )


DIALECT: Final = Dialect(
    name="redrive", is_metadata=is_redrive_header, marks=is_redrive_header, read=_read
)
