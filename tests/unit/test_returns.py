"""A reader believes a record's redrive headers only where they are a return to it.

Each case is what a writer of topics (or a stream processor copying headers) can try:
the headers copied onto another topic or partition, a forged attempt without a
signature, a genuine signature over headers changed afterwards, a copy signed by a key
the reader does not hold; and what a genuine return looks like.
"""

from __future__ import annotations

import base64

import pytest

from redrive.headers import SIGNATURE, RetryHeaders, encode, read_delivery_headers
from redrive.returns import ReturnCheck
from redrive.signing import KeyRing

pytestmark = pytest.mark.unit


def ring(seed: int) -> KeyRing:
    return KeyRing.from_settings([f"k{seed}={base64.b64encode(bytes([seed]) * 32).decode()}"])


OURS, THEIRS = ring(1), ring(2)
RETRY = RetryHeaders(
    destination="orders",
    retry_at=1_800_000_000_000,
    attempt=2,
    partition=1,
    group="billing",
    original_topic="orders",
    original_partition=1,
    original_offset=7,
    id="0123456789abcdef0123456789abcdef",
)
HEADERS = encode(RETRY, [("trace", b"t-1")])


def doubt(
    check: ReturnCheck, headers: list, *, value: bytes = b"v", on=("orders", 1)
) -> str | None:
    delivery = read_delivery_headers(headers)
    assert delivery is not None
    return check.doubt(headers, b"k", value, delivery, on, destination=on[0])


def test_without_keys_a_return_is_what_names_the_topic_and_partition_it_is_read_on() -> None:
    plain = ReturnCheck()
    assert doubt(plain, HEADERS) is None
    copied = doubt(plain, HEADERS, on=("audit", 1))  # a stream processor's copy elsewhere
    assert copied is not None and "'orders'" in copied and "a copy" in copied
    moved = doubt(plain, HEADERS, on=("orders", 0))
    assert moved is not None and "partition 1" in moved


def test_with_keys_only_a_signature_of_ours_over_the_record_as_read_is_believed() -> None:
    check = ReturnCheck(OURS)
    signed = OURS.signed(HEADERS, b"k", b"v")
    assert doubt(check, signed) is None
    assert "not signed" in (doubt(check, HEADERS) or "")  # a forged attempt, unsigned
    assert doubt(check, THEIRS.signed(HEADERS, b"k", b"v")) is not None  # another key
    assert doubt(check, signed, value=b"other") is not None  # the value changed
    raised = encode(RetryHeaders(**{**_fields(RETRY), "attempt": 9}), [("trace", b"t-1")])
    forged = [*raised, signed[-1]]  # the genuine signature over a higher attempt
    assert doubt(check, forged) is not None
    assert doubt(check, [*signed, (SIGNATURE, signed[-1][1])]) is not None  # two signatures
    assert doubt(check, signed, on=("audit", 1)) is not None  # signed, but copied elsewhere


def test_while_rolling_out_an_unsigned_return_is_believed_but_a_bad_signature_is_not() -> None:
    rolling = ReturnCheck(OURS, trust_unsigned=True)
    assert doubt(rolling, HEADERS) is None
    assert doubt(rolling, [*HEADERS, (SIGNATURE, b"v1:k1:AAAA")]) is not None
    assert doubt(rolling, HEADERS, on=("audit", 1)) is not None


def _fields(headers: RetryHeaders) -> dict[str, object]:
    return {name: getattr(headers, name) for name in headers.__dataclass_fields__}
