"""Forged and copied redrive headers against the Spark pipeline and the Spark scheduler,
on real Spark (local mode) and the real broker, with signing keys configured.

What someone who may write the topics (but holds no key) tries, and what a stream
processor copying headers does:

- the pipeline: a record on its source topic carrying a genuine-looking retry's headers,
  copied, unsigned: handled as a new record (attempt 1, its failure named where it was
  read); beside it a genuine signed delivery, handled at its attempt;
- the scheduler: requests under the identity of a signed, accepted one, in its own
  micro-batch and in a later one (unsigned with another value, or with a signature that
  does not verify): the genuine is delivered once, each forgery is a dead letter for an
  invalid signature, counted.
"""

from __future__ import annotations

import base64
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

from redrive.deadlines import Deadline
from redrive.headers import (
    DEAD_LETTER_REASON,
    Header,
    RetryHeaders,
    decode,
    encode,
    failure_request_id,
    read_delivery_headers,
)
from redrive.returns import ReturnCheck
from redrive.signing import KeyRing, SignatureCheck
from redrive.spark.observed import OBSERVED
from redrive.spark.pipeline import start_pipeline
from redrive.spark.repeats import FORGED_REASON, repeats_dropped
from redrive.spark.scheduler import build_scheduler_query
from redrive.spark.session import spark_session, stop_with_jvm
from tests.integration.service_harness import now_ms, produce
from tests.spark import TopicReader, create_topics, unique

pytestmark = pytest.mark.spark

# Spark's Python workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = KeyRing.from_settings([f"spark-test={base64.b64encode(b'f' * 32).decode()}"])
GROUP = "billing"


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("redrive-test-forged-headers")
    yield session
    stop_with_jvm(session)


def handle(key: bytes | None, value: bytes | None, headers: list[Header], attempt: int) -> bytes:
    if (value or b"").startswith(b"fail"):
        raise TimeoutError(f"failed at attempt {attempt}")
    return b"%s at %d" % (value or b"", attempt)


def observed(query: Any, name: str) -> int:
    """One of redrive's observed counts of the query, over its progress reports."""
    total = 0
    for progress in query.recentProgress:
        counts = progress.observedMetrics.get(OBSERVED)
        if counts is not None:
            total += int(counts[name] or 0)  # null: a batch without rows
    return total


def wait_for_count(query: Any, name: str, expected: int) -> None:
    deadline = Deadline(60)
    while observed(query, name) < expected and not deadline.passed():
        assert query.exception() is None, query.exception()
        time.sleep(0.2)


def test_the_pipeline_believes_a_signed_return_and_takes_a_copy_for_a_new_record(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    source, output, requests = unique("orders"), unique("orders-out"), unique("requests")
    create_topics(bootstrap, source, requests, output)

    def retry(value: bytes) -> list[Header]:
        """A retry's headers as the retry service delivers them to the source topic."""
        headers = RetryHeaders(
            destination=source,
            retry_at=now_ms(),
            attempt=2,
            partition=0,
            group=GROUP,
            original_topic=source,
            original_partition=0,
            original_offset=999,
            id=KEYS.sealed_id(failure_request_id(GROUP, 2, (source, 0, 999), None)),
        )
        return encode(headers, [("trace", value)])

    records = [
        {"key": b"k", "value": b"copied", "headers": retry(b"copied")},
        {"key": b"k", "value": b"fail-copied", "headers": retry(b"fail-copied")},
        {
            "key": b"k",
            "value": b"genuine",
            "headers": KEYS.signed(retry(b"genuine"), b"k", b"genuine"),
        },
    ]
    produce(bootstrap, source, [{**record, "partition": 0} for record in records])
    reader = TopicReader(bootstrap, [output, requests])
    pipeline = start_pipeline(
        spark,
        bootstrap,
        source,
        handle,
        policy="1s x5",
        output_topic=output,
        group=GROUP,
        requests_topic=requests,
        signing=KEYS,
        checkpoint=str(tmp_path / "pipeline"),
        trigger_interval="500 milliseconds",
    )
    try:
        reader.wait_for(2, timeout_s=180, topic=output, queries=(pipeline,))
        reader.wait_for(1, timeout_s=60, topic=requests, queries=(pipeline,))
        wait_for_count(pipeline, "doubted", 2)
        reader.poll(1)
        assert pipeline.isActive and pipeline.exception() is None
    finally:
        pipeline.stop()
        reader.close()

    assert sorted(r.value for r in reader.of(output)) == [b"copied at 1", b"genuine at 3"]
    assert observed(pipeline, "doubted") == 2
    # The copy that failed: a first failure, named where it was read, its id sealed.
    [request] = reader.of(requests)
    headers, user = decode(request.headers)
    assert user == [("trace", b"fail-copied")]
    assert headers.attempt == 1
    assert (headers.original_topic, headers.original_partition, headers.original_offset) == (
        source,
        0,
        1,
    )
    assert headers.id == KEYS.sealed_id(failure_request_id(GROUP, 1, (source, 0, 1), None))
    assert headers.signature is not None


def signed_request(destination: str, value: bytes, identity: str) -> list[Header]:
    headers = encode(RetryHeaders(destination=destination, retry_at=now_ms(), id=identity))
    return KEYS.signed(headers, b"k", value)


def test_the_scheduler_delivers_the_genuine_once_and_refuses_requests_forged_under_its_id(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    requests, dlq, destination = unique("requests"), unique("dlq"), unique("ok-dest")
    create_topics(bootstrap, requests, destination, partitions=2)
    create_topics(bootstrap, dlq)
    # The id a signing pipeline writes for a first failure: sealed, no outsider can make it.
    identity = KEYS.sealed_id(failure_request_id(GROUP, 1, ("orders", 0, 7), None))
    genuine = signed_request(destination, b"genuine", identity)
    unsigned = encode(RetryHeaders(destination=destination, retry_at=now_ms(), id=identity))
    bad_mac = [*unsigned, genuine[-1]]  # the genuine's signature, over another value
    # Before the query starts, so that its first micro-batch reads them together: the
    # unsigned copy first, read before the genuine.
    produce(
        bootstrap,
        requests,
        [
            {"key": b"k", "value": b"forged-first", "headers": unsigned},
            {"key": b"k", "value": b"genuine", "headers": genuine},
            {"key": b"k", "value": b"forged-mac", "headers": bad_mac},
        ],
    )
    reader = TopicReader(bootstrap, [destination, dlq])
    query = build_scheduler_query(
        spark,
        bootstrap=bootstrap,
        requests_topic=requests,
        dlq_topic=dlq,
        allowed_destinations=["ok-*"],
        checkpoint=str(tmp_path / "scheduler"),
        trigger_interval="1 second",
        query_name=None,
        signatures=SignatureCheck(KEYS, required=False),
    )
    try:
        reader.wait_for(1, timeout_s=180, topic=destination, queries=(query,))
        reader.wait_for(2, timeout_s=60, topic=dlq, queries=(query,))
        # A later micro-batch: another unsigned request under the accepted identity, and
        # the genuine again (a true repeat, dropped).
        produce(
            bootstrap,
            requests,
            [
                {"key": b"k", "value": b"forged-later", "headers": unsigned},
                {"key": b"k", "value": b"genuine", "headers": genuine},
            ],
        )
        reader.wait_for(3, timeout_s=120, topic=dlq, queries=(query,))
        wait_for_count(query, "invalid_signature", 3)
        deadline = Deadline(60)
        while repeats_dropped(query) < 1 and not deadline.passed():
            time.sleep(0.2)
        reader.poll(2)
        assert query.isActive and query.exception() is None
    finally:
        query.stop()
        reader.close()

    [delivered] = reader.of(destination)
    assert delivered.value == b"genuine" and delivered.headers == genuine
    # Delivered with its signature: its reader believes it.
    delivery = read_delivery_headers(delivered.headers)
    assert delivery is not None
    on = (destination, delivered.partition)
    assert ReturnCheck(KEYS).doubt(genuine, b"k", b"genuine", delivery, on, destination) is None
    reasons = {r.value: r.header(DEAD_LETTER_REASON) for r in reader.of(dlq)}
    assert set(reasons) == {b"forged-first", b"forged-mac", b"forged-later"}
    assert reasons[b"forged-first"] == reasons[b"forged-later"] == FORGED_REASON.encode()
    assert (reasons[b"forged-mac"] or b"").startswith(b"invalid signature: the signature")
    assert observed(query, "invalid_signature") == 3
    assert observed(query, "delivered") == 1
    assert repeats_dropped(query) == 1
