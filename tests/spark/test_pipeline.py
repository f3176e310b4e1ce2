"""The pipeline building block on real Spark (local mode) and the real broker.

1,000 records go through a handler where 10% fail twice and then succeed, 1% fail
fatally, and one makes the policy itself raise. The Spark scheduler brings the
retries back to the source topic. Every good record must come out once, the fatal
ones must be dead letters with their error, retries must come back no earlier than
their delay, and the query must still be running at the end.

A second test runs the same pipeline with the retry service (`redrive serve`, in
process, on the real PostgreSQL) and a per-group retry topic instead.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark import cloudpickle

from redrive.headers import (
    DEAD_LETTER_REASON,
    Header,
    decode,
    describe_error,
    encode,
    next_request,
    request_id,
)
from redrive.policy import policy
from redrive.router import SourceRecord
from redrive.spark.batches import handle_batch
from redrive.spark.output import to_arrow
from redrive.spark.pipeline import REQUIRED_COLUMNS, _record_handler, start_pipeline
from redrive.spark.record_handler import Destinations, RecordHandler
from redrive.spark.scheduler import build_scheduler_query
from redrive.spark.session import spark_session, stop_with_jvm
from tests.integration.consumer_harness import wait_for
from tests.integration.kcat import kcat_produce
from tests.integration.service_harness import (
    dead_letters,
    fresh_database,
    produce,
    running_service,
    settings_for,
)
from tests.spark import TopicReader, create_topics, unique

pytestmark = pytest.mark.spark

# Spark's Python workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

RECORDS = 1_000


class Flaky(BaseException):
    """Not an Exception subclass: a failure the query must survive all the same."""


def is_fatal(n: int) -> bool:
    return n % 100 == 7


def is_flaky(n: int) -> bool:
    return n % 10 == 3


BOMB = 999  # its error makes the policy's predicate raise
POISON = 993  # flaky, and written with a header name that is not UTF-8
POISON_HEADERS = [(b"trace", b"t993"), (b"x-\xff\xfe", b"1")]
POISON_AS_READ = [("x-\ufffd\ufffd", b"1")]


def handler(key: bytes | None, value: bytes | None, headers: list[Header], attempt: int) -> bytes:
    n = int(value or b"-1")
    if is_fatal(n):
        raise ValueError(f"bad record {n}")
    if n == BOMB:
        raise RuntimeError("bomb")
    if is_flaky(n) and attempt <= 2:
        if n % 20 == 3:
            raise ConnectionError(f"flaky {n}, attempt {attempt}")
        raise Flaky(f"flaky {n}, attempt {attempt}")
    trace = dict(headers)["trace"] or b""
    return json.dumps({"n": n, "attempt": attempt, "trace": trace.decode()}).encode()


def retryable(error: BaseException) -> bool | None:
    if "bomb" in str(error):
        raise RuntimeError("the predicate itself is broken")
    return None


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("redrive-test-pipeline")
    yield session
    stop_with_jvm(session)


def test_failures_are_retried_and_dead_lettered_and_the_query_survives(
    spark: Any, bootstrap: str, tmp_path: Any
) -> None:
    source, output = unique("orders"), unique("orders-out")
    requests, dlq = unique("requests"), unique("dlq")
    create_topics(bootstrap, source, requests, partitions=2)
    create_topics(bootstrap, output, dlq)
    produce(
        bootstrap,
        source,
        [
            {
                "key": f"k{n}".encode(),
                "value": str(n).encode(),
                "headers": [("trace", f"t{n}".encode())],
            }
            for n in range(RECORDS)
            if n != POISON
        ],
    )
    # Any producer can write a header name that is not UTF-8; Spark's Kafka source (the
    # Java client) reads it with U+FFFD in place of the bad bytes, and it travels so.
    kcat_produce(bootstrap, source, b"k%d" % POISON, b"%d" % POISON, POISON_HEADERS)
    reader = TopicReader(bootstrap, [output, requests, dlq, source])
    scheduler = build_scheduler_query(
        spark,
        bootstrap=bootstrap,
        requests_topic=requests,
        dlq_topic=dlq,
        allowed_destinations=[source],
        checkpoint=str(tmp_path / "scheduler"),
        query_name=None,
    )
    started = time.monotonic()
    pipeline = start_pipeline(
        spark,
        bootstrap,
        source,
        handler,
        policy=policy("1s x3", retryable=retryable),
        fatal_on=ValueError,
        output_topic=output,
        group="billing",
        requests_topic=requests,
        checkpoint=str(tmp_path / "pipeline"),
        trigger_interval="500 milliseconds",
    )
    fatal = {n for n in range(RECORDS) if is_fatal(n)} | {BOMB}
    flaky = {n for n in range(RECORDS) if is_flaky(n)}
    good = set(range(RECORDS)) - fatal
    try:
        reader.wait_for(len(good), timeout_s=300, topic=output, queries=(pipeline, scheduler))
        reader.wait_for(len(fatal), timeout_s=60, topic=dlq, queries=(pipeline, scheduler))
        reader.poll(3)  # duplicates or strays would show up here
        print(f"all {len(good)} results after {time.monotonic() - started:.1f} s")
        assert pipeline.isActive and pipeline.exception() is None
        assert scheduler.isActive and scheduler.exception() is None
    finally:
        pipeline.stop()
        scheduler.stop()
        reader.close()

    # Every good record comes out exactly once, after as many attempts as it needed.
    results = [json.loads(r.value or b"") for r in reader.of(output)]
    assert Counter(r["n"] for r in results) == Counter(good)
    for result in results:
        assert result["attempt"] == (3 if result["n"] in flaky else 1)
        assert result["trace"] == f"t{result['n']}"  # the user's headers travel along

    # When each record was delivered to the pipeline, by (record, attempt).
    delivered: dict[tuple[int, int], int] = {}
    for message in reader.of(source):
        attempt = int(message.header("redrive-attempt") or b"0") + 1
        delivered[int(message.value or b""), attempt] = message.timestamp_ms

    # Retry requests: two per flaky record, with the contract headers.
    retries = [r for r in reader.of(requests) if r.header("redrive-send-to") == b"retry"]
    assert Counter(int(r.value or b"") for r in retries) == Counter(2 * sorted(flaky))
    for request in retries:
        headers, user = decode(request.headers)
        n = int(request.value or b"")
        assert user == [("trace", f"t{n}".encode()), *(POISON_AS_READ if n == POISON else [])]
        assert headers.destination == source and headers.group == "billing"
        assert headers.original_topic == source and headers.original_offset is not None
        assert headers.partition == headers.original_partition
        assert headers.attempt in (1, 2)
        assert headers.error_type == ("ConnectionError" if n % 20 == 3 else f"{__name__}.Flaky")
        assert headers.error_message == f"flaky {n}, attempt {headers.attempt}"
        # Due one second after the failure, which came after the delivery that failed
        # and before the request was written.
        failed_at = headers.retry_at - 1_000
        assert delivered[n, headers.attempt] <= failed_at <= request.timestamp_ms

    # Redeliveries on the source topic: never before due, on the partition they left.
    redelivered = [r for r in reader.of(source) if r.header("redrive-retry-at")]
    assert len(redelivered) == len(retries)
    lateness = []
    for message in redelivered:
        headers, _ = decode(message.headers)
        assert message.timestamp_ms >= headers.retry_at
        assert message.partition == headers.original_partition
        lateness.append(message.timestamp_ms - headers.retry_at)
    print(f"redelivered after due: min {min(lateness)} ms, max {max(lateness)} ms")

    # Dead letters: through the requests topic (send-to dlq) to the DLQ topic, with the error.
    letters = {int(r.value or b""): r for r in reader.of(dlq)}
    assert set(letters) == fatal and len(reader.of(dlq)) == len(fatal)
    for n, letter in letters.items():
        reason = (letter.header(DEAD_LETTER_REASON) or b"").decode()
        assert reason.startswith("sent to the dead letters by its consumer")
        assert letter.header("redrive-send-to") == b"dlq"
        assert letter.header("redrive-attempt") == b"1"
        assert letter.header("redrive-group") == b"billing"
        assert letter.header("redrive-original-topic") == source.encode()
        if n == BOMB:
            assert letter.header("redrive-error-type") == b"RuntimeError"
            assert b"policy error" in (letter.header("redrive-reason") or b"")
        else:
            assert letter.header("redrive-error-type") == b"ValueError"
            assert letter.header("redrive-error-message") == f"bad record {n}".encode()
            assert letter.header("redrive-reason") == (
                b"fatal error: ValueError (matches fatal_on ValueError)"
            )
            assert b"ValueError: bad record" in (letter.header("redrive-error-trace") or b"")


def dead_letter_values(database_url: str) -> list[int]:
    """The values of the retry service's dead letters, sorted."""
    return sorted(int(row["msg_value"]) for row in dead_letters(database_url))


def test_with_the_retry_service_and_a_per_group_topic(
    spark: Any, bootstrap: str, database_url: str, tmp_path: Any
) -> None:
    source, output, group = unique("payments"), unique("payments-out"), "ledger"
    retry = f"{group}.{source}.retry"
    create_topics(bootstrap, source, retry, partitions=2)
    create_topics(bootstrap, output)
    count = 60
    produce(
        bootstrap,
        source,
        [
            {
                "key": f"k{n}".encode(),
                "value": str(n).encode(),
                "headers": [("trace", f"t{n}".encode())],
            }
            for n in range(count)
        ],
    )
    # Retries go to the group's retry topic; dead letters name the source topic (where a
    # replay goes), as the Python consumer's do.
    settings = settings_for(
        bootstrap, fresh_database(database_url), allowed_destinations=[retry, source]
    )
    reader = TopicReader(bootstrap, [output, retry])
    fatal = {n for n in range(count) if is_fatal(n)}
    flaky = {n for n in range(count) if is_flaky(n)}
    good = set(range(count)) - fatal
    with running_service(settings):
        pipeline = start_pipeline(
            spark,
            bootstrap,
            [source],
            handler,
            policy="1s x3",
            fatal_on=ValueError,
            output_topic=output,
            group=group,
            requests_topic=settings.requests_topic,
            per_group_topic=True,
            checkpoint=str(tmp_path / "pipeline"),
            trigger_interval="500 milliseconds",
        )
        try:
            reader.wait_for(len(good), timeout_s=180, topic=output)
            # Each flaky record came back twice before its result: read what the reader
            # has not read yet of the retry topic, then anything more.
            reader.wait_for(2 * len(flaky), timeout_s=60, topic=retry)
            reader.poll(2)
            assert pipeline.isActive and pipeline.exception() is None
        finally:
            pipeline.stop()
            reader.close()
        # The service stores the dead letters as their requests come in.
        wait_for(lambda: dead_letter_values(settings.database_url or "") == sorted(fatal), 60)
        letters = dead_letters(settings.database_url or "")

    results = [json.loads(r.value or b"") for r in reader.of(output)]
    assert Counter(r["n"] for r in results) == Counter(good)
    assert all(r["attempt"] == (3 if r["n"] in flaky else 1) for r in results)
    # Retries came back on the group's retry topic, not on the shared source topic.
    assert Counter(int(r.value or b"") for r in reader.of(retry)) == Counter(2 * sorted(flaky))
    # Dead letters are in the retry service's store, with their error.
    assert sorted(int(row["msg_value"]) for row in letters) == sorted(fatal)
    for row in letters:
        assert row["reason_code"] == "fatal_error"  # what the pipeline's policy decided
        assert row["error_type"] == "ValueError"
        assert row["error_message"] == f"bad record {int(row['msg_value'])}"
        assert row["group_id"] == group and row["original_topic"] == source


def test_record_routing_without_spark() -> None:
    """What the executors do per record, checked directly: the headers are exactly those
    the Python consumer writes, and no failure escapes but KeyboardInterrupt/SystemExit."""
    error = ConnectionError("gateway down")

    def failing(
        key: bytes | None, value: bytes | None, headers: list[Header], attempt: int
    ) -> bytes:
        raise error

    destinations = Destinations(output_topic="out", group="billing", requests_topic="requests")
    run = RecordHandler(failing, policy("1s x3"), destinations, clock=lambda: 1_000_000)
    record = SourceRecord("orders", 1, 42, 999_000, b"k", b"v", [("trace", b"t1")])
    out = run(record)
    assert out is not None and out.topic == "requests" and (out.key, out.value) == (b"k", b"v")
    expected = next_request(
        None,
        destination="orders",
        retry_at=1_001_000,
        error=describe_error(error),
        record_topic="orders",
        record_partition=1,
        record_offset=42,
        record_timestamp=999_000,
        group="billing",
        partition=1,
    )
    expected = dataclasses.replace(expected, id=request_id(expected))
    assert out.headers == encode(expected, [("trace", b"t1")])

    def wrong_type(
        key: bytes | None, value: bytes | None, headers: list[Header], attempt: int
    ) -> Any:
        return "not bytes"

    out = RecordHandler(wrong_type, policy("1s x3", fatal_on=TypeError), destinations)(record)
    assert out is not None and dict(out.headers)["redrive-send-to"] == b"dlq"
    assert dict(out.headers)["redrive-error-type"] == b"TypeError"

    def interrupted(
        key: bytes | None, value: bytes | None, headers: list[Header], attempt: int
    ) -> bytes:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        RecordHandler(interrupted, policy("1s x3"), destinations)(record)


def test_a_replayed_record_keeps_its_round_into_its_request_and_dead_letter() -> None:
    """A record the retry service replayed carries its round (the loop guard's): the
    pipeline writes it into its retry request, and into its dead letter (without Spark)."""

    def failing(
        key: bytes | None, value: bytes | None, headers: list[Header], attempt: int
    ) -> bytes:
        raise ValueError("still broken")

    destinations = Destinations(output_topic="out", group="billing", requests_topic="requests")
    replayed = [("trace", b"t1"), ("redrive-replays", b"2"), ("redrive-replay-of", b"41")]
    record = SourceRecord("orders", 1, 42, 999_000, b"k", b"v", replayed)
    for rules in (policy("1s x3"), policy("1s x3", fatal_on=ValueError)):
        out = RecordHandler(failing, rules, destinations, clock=lambda: 1_000_000)(record)
        assert out is not None
        headers = dict(out.headers)
        assert (headers["redrive-replays"], headers["redrive-replay-of"]) == (b"2", b"41")
        # The user's headers travel; the round is written once, as a contract header.
        assert [n for n, _ in out.headers].count("redrive-replays") == 1


def test_the_pipeline_takes_the_apps_policy_options_by_the_same_names() -> None:
    """with_retries's options are the App handlers' (the policy's options, and
    ``per_group_topic``): checked where the executors' handler is made, without Spark."""

    class KafkaSource:  # what is checked of a DataFrame before anything runs
        columns = REQUIRED_COLUMNS

    def handle(
        key: bytes | None, value: bytes | None, headers: list[Header], attempt: int
    ) -> bytes:
        return b""

    made = _record_handler(
        KafkaSource(),
        handle,
        "1s x*",
        "out",
        "billing",
        {
            "per_group_topic": True,
            "max_attempts": 4,
            "max_duration": "1h",
            "deadline_from": "record-timestamp",
            "fatal_on": ValueError,
            "retry_on": None,  # unset, as before
        },
    )
    assert made.destinations.retry_destination("orders") == "billing.orders.retry"
    assert made.policy == policy(
        "1s x*",
        max_attempts=4,
        max_duration="1h",
        deadline_from="record-timestamp",
        fatal_on=ValueError,
    )
    with pytest.raises(TypeError, match="'per_group_retry_topic' is now 'per_group_topic'"):
        _record_handler(
            KafkaSource(),
            handle,
            "1s",
            "out",
            "billing",
            {"per_group_retry_topic": True},  # type: ignore[typeddict-unknown-key]
        )
    with pytest.raises(TypeError, match="unknown option"):
        _record_handler(KafkaSource(), handle, "1s", "out", "billing", {"strategy": "pause"})  # type: ignore[typeddict-unknown-key]


def test_a_batch_is_routed_as_record_by_record() -> None:
    """The executors' batch path (no SourceRecord per record, Arrow converted column by
    column) gives exactly the rows of RecordHandler called on each record, in order."""
    import pyarrow as pa

    def flaky(key: bytes | None, value: bytes | None, headers: list[Header], attempt: int) -> Any:
        text = (value or b"").decode()
        if text == "none":
            return None
        if text == "str":
            return "not bytes"
        if text == "fatal" or (text.startswith("fail") and attempt < 3):
            raise ConnectionError(f"{text} on attempt {attempt}")
        return json.dumps({"v": text, "attempt": attempt, "headers": len(headers)}).encode()

    def redelivery(attempt: int, group: str, user: list[Header]) -> list[Header]:
        previous = None
        for n in range(attempt):
            previous = next_request(
                previous,
                destination="orders",
                retry_at=999_000 + n,
                error=ConnectionError(f"attempt {n + 1}"),
                record_topic="orders",
                record_partition=0,
                record_offset=7,
                record_timestamp=998_000,
                group=group,
            )
        assert previous is not None
        return encode(previous, user)

    destinations = Destinations(output_topic="out", group="billing", requests_topic="requests")
    run = RecordHandler(flaky, policy("1s x3"), destinations, clock=lambda: 1_000_000)
    rows: list[tuple[bytes | None, bytes | None, list[Header] | None]] = [
        (b"k0", b"ok", None),
        (b"k1", b"none", None),
        (None, b"fail-new", None),  # a retry request, attempt 1
        (b"k3", b"str", []),  # a wrong type: retried like any failure
        (b"k4", b"ok", [("trace", b"t4"), ("empty", None)]),
        (b"k5", b"fail-again", redelivery(1, "billing", [("trace", b"t5")])),  # attempt 2
        (b"k6", b"fail-done", redelivery(2, "billing", [])),  # attempt 3 succeeds
        (b"k7", b"fatal", redelivery(3, "billing", [])),  # policy spent: a dead letter
        (b"k8", b"fail-theirs", redelivery(2, "other", [])),  # another group's: attempt 1
        (b"k9", None, None),
    ]
    records = [
        SourceRecord("orders", n % 2, 100 + n, None if n == 2 else 990_000 + n, k, v, h or [])
        for n, (k, v, h) in enumerate(rows)
    ]
    header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    batch = pa.RecordBatch.from_pydict(
        {
            "topic": pa.array([r.topic for r in records], pa.string()),
            "partition": pa.array([r.partition for r in records], pa.int32()),
            "offset": pa.array([r.offset for r in records], pa.int64()),
            # Kafka's "no timestamp" is -1: the record's timestamp_ms is None.
            "timestamp_ms": pa.array([r.timestamp_ms or -1 for r in records], pa.int64()),
            "key": pa.array([k for k, _, _ in rows], pa.binary()),
            "value": pa.array([v for _, v, _ in rows], pa.binary()),
            "headers": pa.array(
                [None if h is None else [{"key": n, "value": v} for n, v in h] for *_, h in rows],
                pa.list_(header),
            ),
        }
    )

    def rows_of(out: Any) -> list[dict[str, Any]]:
        """Output rows, each error trace without its first frame (redrive's own, which
        differs between the two paths): from the handler's frame on, they must match."""
        table = out.to_pylist()
        for row in table:
            for header in row["headers"]:
                if header["key"] == "redrive-error-trace":
                    own = (
                        rb'  File "[^"]*/redrive/spark/(?:record_handler|batches)\.py"'
                        rb'.*?(?=  File ")'
                    )
                    header["value"] = re.sub(own, b"", header["value"], count=1, flags=re.S)
        return table

    expected = to_arrow([out for out in map(run, records) if out is not None])
    got = handle_batch(run, batch)
    assert got.schema == expected.schema
    assert rows_of(got) == rows_of(expected)
    assert "in handle_batch" not in str(rows_of(got))  # the first frames were cut
    assert "in handle_batch" in str(got.to_pylist())
    topics = got.column("topic").to_pylist()
    assert topics.count("requests") == 5 and topics.count("out") == 4  # all paths covered
    assert got.column("headers").null_count == 0  # no headers: an empty list, not null

    # The common batch: no record has headers (a null column), nothing fails.
    ok = batch.filter(pa.array([v in (b"ok", b"none") for _, v, _ in rows]))
    ok = ok.set_column(6, "headers", pa.nulls(len(ok), pa.list_(header)))
    got = handle_batch(run, ok)
    assert got.column("headers").to_pylist() == [[], []]
    assert got.column("topic").to_pylist() == ["out", "out"]
    assert got.column("partition").to_pylist() == [None, None]
    assert handle_batch(run, ok.slice(0, 0)).num_rows == 0

    # Every record gives a value (one with user headers, one redelivered): the output
    # is built from whole columns, and must still be what each record gives.
    done = [n for n, (_, v, _) in enumerate(rows) if v in (b"ok", b"fail-done")]
    all_ok = batch.take(pa.array(done))
    expected = to_arrow([out for n in done if (out := run(records[n])) is not None])
    got = handle_batch(run, all_ok)
    assert rows_of(got) == rows_of(expected)
    assert [r["headers"] for r in got.to_pylist()] == [
        [],
        [{"key": "trace", "value": b"t4"}, {"key": "empty", "value": None}],
        [],
    ]
    assert got.column("key").to_pylist() == [b"k0", b"k4", b"k6"]
