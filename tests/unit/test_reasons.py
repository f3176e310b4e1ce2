"""The one vocabulary of reason codes: values that are stored and counted never change."""

from __future__ import annotations

import pytest

from redrive.policy import DeadLetter, policy
from redrive.policy import DeadLetterReason as PolicyReason
from redrive.reasons import DeadLetterReason

pytestmark = pytest.mark.unit


def test_the_codes_are_the_stored_values() -> None:
    # reason_code of redrive_dead_letters and the `reason` label of the metrics hold
    # these: changing one needs a schema migration, adding one does not.
    assert {reason.name: reason.value for reason in DeadLetterReason} == {
        "FATAL_ERROR": "fatal_error",
        "ATTEMPTS_EXHAUSTED": "attempts_exhausted",
        "DEADLINE_PASSED": "deadline_passed",
        "INVALID_REQUEST": "invalid_request",
        "DESTINATION_NOT_ALLOWED": "destination_not_allowed",
        "UNKNOWN_DESTINATION": "unknown_destination",
        "PARTITION_OUT_OF_RANGE": "partition_out_of_range",
        "EMPTY_VALUE": "empty_value",
        "RETRY_AT_TOO_FAR": "retry_at_too_far",
        "INVALID_SIGNATURE": "invalid_signature",
        "SENT_TO_DLQ": "sent_to_dlq",
        "DELIVERY_FAILED": "delivery_failed",
        "CANCELLED": "cancelled",
        "INGESTED": "ingested",
    }


def test_the_policy_decides_with_the_same_enumeration() -> None:
    assert PolicyReason is DeadLetterReason
    decision = policy("1s x1").decide(2, TimeoutError("slow"), now_ms=0)
    assert isinstance(decision, DeadLetter)
    assert decision.reason is DeadLetterReason.ATTEMPTS_EXHAUSTED
    assert f"{decision.reason}" == "attempts_exhausted"  # a str where a str is wanted
