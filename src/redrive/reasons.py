"""Why a message became a dead letter: the one vocabulary of reason codes.

A policy's decision (:class:`redrive.policy.DeadLetter`), the retry service's intake
and scheduler, an operator's cancel and the Spark scheduler all name their reason
with a member of :class:`DeadLetterReason`. The values are stored (the
``reason_code`` column of ``redrive_dead_letters``), filtered on in the API and UI,
and used as the ``reason`` label of the service's metrics: a value, once released,
never changes (a new code is a new member).
"""

from __future__ import annotations

from enum import StrEnum


class DeadLetterReason(StrEnum):
    """Why a message became a dead letter; stable values, safe to store and filter on."""

    # Decided by a policy (also by the service for a deadline that passed); a
    # consumer's dead letter says which in redrive-reason-code.
    FATAL_ERROR = "fatal_error"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    DEADLINE_PASSED = "deadline_passed"

    # A retry request refused: by the retry service's intake, the Spark scheduler or
    # (for unreadable redrive headers) a consumer.
    INVALID_REQUEST = "invalid_request"
    DESTINATION_NOT_ALLOWED = "destination_not_allowed"
    UNKNOWN_DESTINATION = "unknown_destination"
    PARTITION_OUT_OF_RANGE = "partition_out_of_range"
    EMPTY_VALUE = "empty_value"
    RETRY_AT_TOO_FAR = "retry_at_too_far"
    INVALID_SIGNATURE = "invalid_signature"
    """Its signature is missing (where signatures are required), malformed, of an
    unknown key, or does not match the request (:mod:`redrive.signing`)."""

    SENT_TO_DLQ = "sent_to_dlq"
    """Its consumer gave up (``redrive-send-to: dlq``) without saying which of the
    policy's reasons (no ``redrive-reason-code``: a sender older than that header, or
    another system's); its ``redrive-reason`` says why in words."""

    DELIVERY_FAILED = "delivery_failed"
    """The broker refused the retry's delivery for good (too large, topic gone...)."""

    CANCELLED = "cancelled"
    """An operator cancelled the pending retry."""

    INGESTED = "ingested"
    """A dead letter of another system (a Spring Kafka dead-letter topic, a Kafka
    Connect error topic, a topic of records without metadata), read from a topic the
    service ingests; its ``reason`` says which system and what its error was."""


GIVEN_UP: frozenset[DeadLetterReason] = frozenset(
    {
        DeadLetterReason.FATAL_ERROR,
        DeadLetterReason.ATTEMPTS_EXHAUSTED,
        DeadLetterReason.DEADLINE_PASSED,
        DeadLetterReason.SENT_TO_DLQ,
    }
)
"""The codes of a dead letter a consumer (or the policy) decided: business as usual,
unlike a request the service refused."""
