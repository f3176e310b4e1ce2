"""What the Spark pipeline believes of a record's redrive headers (RecordHandler.read and
handle_batch, without Spark), and the ids it seals.

Each case is what someone who may write the pipeline's topics tries, or what a stream
processor copying headers does: a genuine retry's headers copied onto a new record of
the source topic (handled as new, at attempt 1, its failure named by where it was read),
the headers of a delivery to another topic or partition, an unsigned record on the
group's retry topic (refused: a dead letter, never handled); and a genuine signed return,
believed at its attempt.
"""

from __future__ import annotations

import base64
import pickle
from collections import Counter

import pyarrow as pa
import pytest

from redrive.headers import ID, SIGNATURE, RetryHeaders, decode, encode, failure_request_id
from redrive.policy import policy
from redrive.returns import ReturnCheck
from redrive.router import SourceRecord
from redrive.signing import KeyRing, Verdict
from redrive.spark import record_handler
from redrive.spark.batches import DOUBTED, DOUBTED_COLUMN, handle_batch, handle_batches, route_batch
from redrive.spark.output import header_type
from redrive.spark.record_handler import Destinations, RecordHandler

pytestmark = pytest.mark.unit

KEYS = KeyRing.from_settings([f"p1={base64.b64encode(b'p' * 32).decode()}"])


class Handled:
    """A handler that fails every record (so that its request shows how it was read)
    and notes the attempts it was called at."""

    def __init__(self) -> None:
        self.attempts: list[int] = []

    def __call__(
        self, key: bytes | None, value: bytes | None, headers: object, attempt: int
    ) -> bytes:
        self.attempts.append(attempt)
        raise TimeoutError("slow")


def delivered(topic: str, partition: int, attempt: int, *, signed: bool) -> list:
    """A return of the retry service: the request as it was delivered."""
    headers = encode(
        RetryHeaders(
            destination=topic,
            retry_at=1_000,
            attempt=attempt,
            partition=partition,
            group="billing",
            original_topic="orders",
            original_partition=partition,
            original_offset=3,
            id="0123456789abcdef0123456789abcdef",
        ),
        [("trace", b"t")],
    )
    return KEYS.signed(headers, b"k", b"v") if signed else headers


def handler_of(
    handled: Handled, *, per_group_topic: bool = False, signing: KeyRing | None = KEYS
) -> RecordHandler:
    destinations = Destinations("out", "billing", "reqs", per_group_topic=per_group_topic)
    run = RecordHandler(
        handled, policy("1s x5"), destinations, clock=lambda: 1_000_000, signing=signing
    )
    return run


def test_a_copy_of_a_retrys_headers_on_the_source_topic_is_a_new_record() -> None:
    handled = Handled()
    run = handler_of(handled)
    copied = delivered("orders", 1, 2, signed=False)  # unsigned, the ring configured
    out = run(SourceRecord("orders", 1, 40, 999_000, b"k", b"v", copied))
    assert handled.attempts == [1]
    assert out is not None and out.topic == "reqs"
    request, user = decode(out.headers)
    assert user == [("trace", b"t")]
    assert request.attempt == 1
    # Its failure is named by where it was read, not by what its headers said.
    assert (request.original_topic, request.original_partition, request.original_offset) == (
        "orders",
        1,
        40,
    )
    # The id of a first failure read there, sealed; the request signed.
    plain_id = failure_request_id("billing", 1, ("orders", 1, 40), None)
    assert request.id == KEYS.sealed_id(plain_id) != plain_id
    assert request.signature is not None
    assert KEYS.verify(out.headers, b"k", b"v", request.signature).verdict is Verdict.VALID


def test_the_check_travels_to_the_executors_with_the_keys() -> None:
    shipped = pickle.loads(
        pickle.dumps(RecordHandler(fail, policy("1s"), Destinations("o", "g"), signing=KEYS))
    )
    assert shipped.returns == ReturnCheck(KEYS)


def fail(key: bytes | None, value: bytes | None, headers: object, attempt: int) -> bytes:
    raise TimeoutError("slow")


def test_a_genuine_signed_return_is_believed_and_one_to_elsewhere_is_not() -> None:
    handled = Handled()
    run = handler_of(handled)
    genuine = delivered("orders", 1, 2, signed=True)
    run(SourceRecord("orders", 1, 41, 999_000, b"k", b"v", genuine))
    run(SourceRecord("orders", 0, 42, 999_000, b"k", b"v", genuine))  # another partition
    run(SourceRecord("audit", 1, 43, 999_000, b"k", b"v", genuine))  # another topic
    run(SourceRecord("orders", 1, 44, 999_000, b"k", b"changed", genuine))  # another value
    assert handled.attempts == [3, 1, 1, 1]
    # Without keys, what names the topic and partition it is read on is believed.
    plain = Handled()
    handler_of(plain, signing=None)(
        SourceRecord("orders", 1, 45, 9, b"k", b"v", delivered("orders", 1, 2, signed=False))
    )
    assert plain.attempts == [3]


def test_on_the_groups_retry_topic_only_a_return_is_handled_the_rest_are_dead_letters() -> None:
    handled = Handled()
    run = handler_of(handled, per_group_topic=True)
    retry = "billing.orders.retry"
    assert run.destinations.served_by(retry) == "orders"
    assert run.destinations.served_by("orders") is None
    assert run.destinations.served_by("billing.retry") is None
    for headers in ([], [("trace", b"t")], delivered(retry, 0, 2, signed=False)):
        out = run(SourceRecord(retry, 0, 7, 999_000, b"k", b"v", headers))
        assert out is not None and out.topic == "reqs"
        letter, _ = decode(out.headers)
        assert letter.send_to == "dlq" and letter.reason_code == "fatal_error"
        assert (
            letter.reason is not None
            and f"read on {retry!r}, the group's retry topic" in letter.reason
        )
        assert letter.destination == "orders"  # where a replay goes
        assert letter.error_type == "redrive.spark.record_handler.RefusedReturn"
        assert letter.attempt == 1 and letter.original_offset == 7
        assert letter.signature is not None
    assert handled.attempts == []  # never handled
    run(SourceRecord(retry, 0, 8, 999_000, b"k", b"v", delivered(retry, 0, 2, signed=True)))
    assert handled.attempts == [3]


def arrow(records: list[SourceRecord]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "topic": pa.array([r.topic for r in records], pa.string()),
            "partition": pa.array([r.partition for r in records], pa.int32()),
            "offset": pa.array([r.offset for r in records], pa.int64()),
            "timestamp_ms": pa.array([r.timestamp_ms for r in records], pa.int64()),
            "key": pa.array([r.key for r in records], pa.binary()),
            "value": pa.array([r.value for r in records], pa.binary()),
            "headers": pa.array(
                [[{"key": n, "value": v} for n, v in r.headers] for r in records],
                pa.list_(header_type()),
            ),
        }
    )


def test_a_batch_reads_as_record_by_record_and_counts_what_it_did_not_believe() -> None:
    records = [
        SourceRecord("orders", 1, 50, 999_000, b"k", b"v", delivered("orders", 1, 2, signed=False)),
        SourceRecord("orders", 1, 51, 999_000, b"k", b"v", delivered("orders", 1, 2, signed=True)),
        SourceRecord("orders", 1, 52, 999_000, b"k", b"v", [("trace", b"only the user's")]),
        SourceRecord("orders", 1, 53, 999_000, b"k", b"v", []),
    ]
    one_by_one, batched = Handled(), Handled()
    expected = [handler_of(one_by_one)(r) for r in records]
    routed = route_batch(handler_of(batched), arrow(records))
    assert batched.attempts == one_by_one.attempts == [1, 3, 1, 1]
    assert routed.counts == {DOUBTED: 1}
    got = routed.outputs.to_pylist()
    for row, out in zip(got, expected, strict=True):
        assert out is not None
        assert [h["key"] for h in row["headers"]] == [n for n, _ in out.headers]
        assert dict((h["key"], h["value"]) for h in row["headers"])[ID] == dict(out.headers)[ID]
    # On the group's retry topic, every record is read, with headers or not.
    retry = "billing.orders.retry"
    on_retry = [SourceRecord(retry, 0, n, 9, b"k", b"v", []) for n in range(3)]
    counts: Counter[str] = Counter()
    refused = handle_batch(handler_of(Handled(), per_group_topic=True), arrow(on_retry), counts)
    assert counts == {DOUBTED: 3} and refused.num_rows == 3


def test_for_sparks_sink_the_count_rides_in_a_row_of_its_own() -> None:
    records = [
        SourceRecord("orders", 1, 60, 9, b"k", b"v", delivered("orders", 1, 2, signed=False))
    ]
    run = handle_batches(handler_of(Handled()), counted=True)
    outputs, count = list(run([arrow(records)]))
    assert outputs.column(DOUBTED_COLUMN).null_count == outputs.num_rows == 1
    assert count.to_pylist() == [
        {
            "topic": None,
            "key": None,
            "value": None,
            "headers": None,
            "partition": None,
            DOUBTED_COLUMN: 1,
        }
    ]
    plain = SourceRecord("orders", 1, 61, 9, b"k", b"v", [])
    assert len(list(run([arrow([plain])]))) == 1  # nothing doubted: no row of counts
    assert SIGNATURE in {h["key"] for h in outputs.column("headers").to_pylist()[0]}


def test_records_not_believed_log_once_in_a_while_per_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stream processor copying headers onto every record: each is counted, but the
    executor logs a line per partition every LOG_EVERY_S, saying how many it did not."""
    clock = [1_000.0]
    monkeypatch.setattr(record_handler.time, "monotonic", lambda: clock[0])
    throttle = record_handler._Throttle()
    assert throttle.due("orders", 0) == 0
    assert throttle.due("orders", 0) is None
    assert throttle.due("orders", 1) == 0  # another partition
    assert throttle.due("orders", 0) is None
    clock[0] += record_handler.LOG_EVERY_S
    assert throttle.due("orders", 0) == 2
