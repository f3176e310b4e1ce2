"""The Spark scheduler's judgement of requests before its repeat check, and what its
buckets make of the check's rows (redrive.spark.scheduler_intake, redrive.spark.repeats),
without Spark.

What an attacker without a key tries: a forged request under a genuine request's id (it
must not take the id), an unsigned copy of a signed request in the same micro-batch
(the signed one is accepted, whichever the deduplication met first), a different
request under an identity accepted in an earlier batch (a forgery).
"""

from __future__ import annotations

import base64
import json

import pyarrow as pa
import pytest

from redrive.header_fields import MAX_INT64
from redrive.headers import SIGNATURE, RetryHeaders, encode, read_delivery_headers
from redrive.records import RequestCoordinates
from redrive.requests import IntakeRules, content_of, read_at_identity
from redrive.returns import ReturnCheck
from redrive.signing import KeyRing, SignatureCheck
from redrive.spark.output import OutputRecord, header_type
from redrive.spark.pending_messages import PendingMessage, pack, unpack
from redrive.spark.repeats import Candidate, forgeries
from redrive.spark.scheduler_intake import (
    JUDGED_COLUMNS,
    NOW,
    READ_COLUMNS,
    header_lists,
    judge_batch,
    pending_of,
)

pytestmark = pytest.mark.unit

KEYS = KeyRing.from_settings([f"k1={base64.b64encode(b'1' * 32).decode()}"])
NOW_MS = 1_800_000_000_000
GENUINE_ID = "0123456789abcdef0123456789abcdef"


def rules(required: bool) -> IntakeRules:
    return IntakeRules(
        destination_allowed=lambda topic: topic.startswith("ok"),
        partitions_of=lambda topic: 2,
        max_delay_ms=86_400_000,
        keeps_order=False,
        signatures=SignatureCheck(KEYS, required=required),
    )


def request(value: bytes, *, signed: bool, deadline: int | None = None) -> list:
    headers = encode(
        RetryHeaders(
            destination="ok-orders",
            retry_at=NOW_MS + 5_000,
            partition=1,
            deadline=deadline,
            id=GENUINE_ID,
        )
    )
    return KEYS.signed(headers, b"k", value) if signed else headers


def batch(
    rows: list[tuple[bytes | None, bytes | None, list | None]], first: int = 0
) -> pa.RecordBatch:
    """Requests as the Kafka source reads them, at offsets from ``first``."""
    return pa.RecordBatch.from_pydict(
        {
            "topic": pa.array(["requests"] * len(rows), pa.string()),
            "partition": pa.array([0] * len(rows), pa.int32()),
            "offset": pa.array(range(first, first + len(rows)), pa.int64()),
            "key": pa.array([k for k, _, _ in rows], pa.binary()),
            "value": pa.array([v for _, v, _ in rows], pa.binary()),
            "headers": pa.array(
                [None if h is None else [{"key": n, "value": v} for n, v in h] for *_, h in rows],
                pa.list_(header_type()),
            ),
            NOW: pa.array([NOW_MS] * len(rows), pa.int64()),
        }
    )


def test_a_refused_forgery_does_not_take_the_id_it_claims_and_the_genuine_keeps_it() -> None:
    forged = request(b"evil", signed=False)
    genuine = request(b"good", signed=True)
    bad_mac = [*forged, (SIGNATURE, genuine[-1][1])]  # the genuine's MAC over other bytes
    judged = judge_batch(
        rules(required=True),
        batch([(b"k", b"evil", forged), (b"k", b"evil", bad_mac), (b"k", b"good", genuine)]),
    )
    assert judged.schema.names == [*READ_COLUMNS, *JUDGED_COLUMNS]
    rows = judged.to_pylist()
    for offset in (0, 1):  # refused: dead letters under where they were read
        assert (
            rows[offset]["identity"]
            == read_at_identity(RequestCoordinates("requests", 0, offset)).hex()
        )
        assert rows[offset]["refusal"].startswith("invalid signature: ")
        assert rows[offset]["pending"] is None
    accepted = rows[2]
    assert accepted["identity"] == GENUINE_ID and accepted["refusal"] is None
    assert accepted["content"] == content_of(b"k", b"good", vouched=True).hex()
    assert pending_of(accepted["pending"]) == (NOW_MS + 5_000, "ok-orders", 1, None)
    assert accepted["headers"] == [{"key": n, "value": v} for n, v in genuine]  # passed through


def test_unsigned_copies_keep_the_claimed_id_where_signatures_are_not_required() -> None:
    """Then classify accepts them, and the repeat check is what refuses them: same
    identity, other content (not vouched)."""
    judged = judge_batch(
        rules(required=False),
        batch(
            [
                (b"k", b"good", request(b"good", signed=True)),
                (b"k", b"good", request(b"good", signed=False)),
            ]
        ),
    ).to_pylist()
    assert judged[0]["identity"] == judged[1]["identity"] == GENUINE_ID
    assert judged[0]["content"] != judged[1]["content"]


def test_headers_are_read_from_sliced_batches_with_null_rows() -> None:
    rows = [
        (b"a", b"1", [("x", b"1")]),
        (None, b"2", None),
        (b"c", b"3", [("y", None), ("z", b"")]),
    ]
    column = batch(rows).column("headers")
    assert header_lists(column) == [[("x", b"1")], [], [("y", None), ("z", b"")]]
    assert header_lists(column.slice(1)) == [[], [("y", None), ("z", b"")]]
    assert header_lists(column.slice(0, 0)) == []


def test_a_deadline_at_the_top_of_its_range_stays_exact_and_the_stored_delivery_verifies() -> None:
    headers = request(b"good", signed=True, deadline=MAX_INT64)
    [judged] = judge_batch(rules(required=True), batch([(b"k", b"good", headers)])).to_pylist()
    due, destination, partition, deadline = pending_of(judged["pending"])
    assert deadline == MAX_INT64
    message = PendingMessage(
        due,
        OutputRecord(destination, b"k", b"good", headers, partition),
        deadline,
        ("requests", 0, 0),
    )
    [stored] = unpack(pack([message]))  # through the scheduler's state, as JSON
    delivered = stored.delivery
    assert delivered.headers == headers  # the signature kept
    delivery = read_delivery_headers(delivered.headers)
    assert delivery is not None
    on = (delivered.topic, 1)
    assert (
        ReturnCheck(KEYS).doubt(delivered.headers, b"k", b"good", delivery, on, destination=on[0])
        is None
    )
    assert json.loads(judged["pending"])[3] == MAX_INT64


def candidate(identity: str, value: bytes, offset: int, *, vouched: bool) -> Candidate:
    content = content_of(b"k", value, vouched=vouched).hex()
    return Candidate(identity, content, b"k", value, ("requests", offset % 2, offset))


def test_of_requests_under_a_new_identity_the_vouched_one_is_accepted_then_the_first_read() -> None:
    genuine = candidate("i", b"good", 5, vouched=True)
    copy = candidate("i", b"evil", 1, vouched=False)
    other = candidate("i", b"other", 3, vouched=False)
    assert forgeries([copy, genuine, other], {"i"}) == [True, False, True]
    assert forgeries([genuine, copy], {"i"}) == [False, True]
    # Neither vouched for: the first read, whichever came first in the bucket.
    assert forgeries([other, copy], {"i"}) == [True, False]
    assert forgeries([copy], {"i"}) == [False]


def test_a_request_of_an_identity_whose_marker_did_not_come_is_a_forgery() -> None:
    """Its identity was accepted before (or by a request of another key, in another
    bucket, in this batch): the marker passed the deduplication elsewhere or earlier."""
    genuine = candidate("j", b"good", 2, vouched=True)
    assert forgeries([genuine, candidate("i", b"evil", 1, vouched=False)], {"j"}) == [False, True]
    assert forgeries([], {"j"}) == []
