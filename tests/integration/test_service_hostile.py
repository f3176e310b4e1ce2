"""No record a Kafka producer can write stops the retry service's intake.

The poison pill of issue 14 (a header NAME that is not UTF-8, which made
confluent-kafka's ``Message.headers()`` raise and the service exit on every restart)
and generated hostile records (any header bytes, sizes, timestamps, keys and values)
go through the real broker into a running service: it stays up, each record ends as
a delivery or a dead letter (never lost), and good requests after them still arrive.
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redrive.headers import DESTINATION, RETRY_AT
from redrive.service.service import RetryService
from redrive.service.store.packed_headers import unpack_headers
from tests.integration.kcat import RawHeader, kcat_produce
from tests.integration.service_harness import (
    Collector,
    dead_letters,
    fresh_database,
    now_ms,
    pending_count,
    produce,
    request_headers,
    running_service,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.integration

MARK = "hostile-id"  # a user header naming each generated record, to account for it


def test_a_poison_pill_request_is_a_dead_letter_and_intake_goes_on(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    dest = new_topic("poison-dest")
    db = fresh_database(database_url)
    svc_settings = settings_for(bootstrap, db, allowed_destinations=[dest])
    requests = svc_settings.requests_topic
    key, value = b"poison-\x01\xfe", b"\x00\xff raw value\nwith a newline"
    due = str(now_ms() + 500).encode()

    with running_service(svc_settings) as service:
        produce(
            bootstrap,
            requests,
            [
                {
                    "key": b"before",
                    "value": b"first",
                    "headers": request_headers(dest, now_ms() + 500),
                }
            ],
        )
        kcat_produce(
            bootstrap,
            requests,
            key,
            value,
            [
                (DESTINATION.encode(), dest.encode()),
                (RETRY_AT.encode(), due),
                (b"x-\xff\xfe", b"1"),
                (b"trace-id", b"abc"),
                (b"redrive-\xff", b"2"),
            ],
        )
        produce(
            bootstrap,
            requests,
            [
                {
                    "key": b"after",
                    "value": b"second",
                    "headers": request_headers(dest, now_ms() + 500),
                }
            ],
        )

        collector = Collector(bootstrap, dest)
        delivered = collector.poll_until(2, 30)
        collector.close()
        wait_until(lambda: len(dead_letters(db)) == 1, 30, "the poison pill's dead letter")
        # A crashed role stops the service: "running" in its readiness says it did not.
        assert all(service.readiness().values()), service.readiness()

        [letter] = dead_letters(db)
        with httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as web:
            api = web.get(f"/api/v1/dead-letters/{letter['id']}").json()
            page = web.get(f"/dead-letters/{letter['id']}")

    # The good requests on either side of it arrive intact.
    assert sorted((d.key, d.value) for d in delivered) == [
        (b"after", b"second"),
        (b"before", b"first"),
    ]
    # The bad one is a dead letter with its key and value byte-exact, the headers that
    # could be read, and a reason an operator can act on.
    assert bytes(letter["msg_key"]) == key and bytes(letter["msg_value"]) == value
    assert letter["reason_code"] == "invalid_request"
    assert "not valid UTF-8" in letter["reason"] and "2 of 5" in letter["reason"]
    assert unpack_headers(letter["headers"]) == [
        (DESTINATION, dest.encode()),
        (RETRY_AT, due),
        ("trace-id", b"abc"),
    ]
    assert letter["request_topic"] == requests
    # Visible to operators, raw bytes included.
    assert base64.b64decode(api["key"]["base64"]) == key
    assert base64.b64decode(api["value"]["base64"]) == value
    assert page.status_code == 200 and "not valid UTF-8" in page.text
    shown = page.text.replace(" ", "")  # the page shows binary as a hex dump
    assert value[:16].hex() in shown and key.hex() in shown


# ------------------------------------------------------------------ generated records


@dataclass(frozen=True)
class Hostile:
    """One generated record: raw header names (any bytes), as any producer may write."""

    key: bytes | None
    value: bytes | None
    headers: tuple[RawHeader, ...]
    timestamp: int | None
    valid_request: bool  # led by a well-formed destination and retry-at

    def needs_kcat(self) -> bool:
        return any(_not_utf8(name) for name, _ in self.headers)


def _not_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


CONTRACT_NAMES = [
    b"redrive-destination",
    b"redrive-retry-at",
    b"redrive-attempt",
    b"redrive-partition",
    b"redrive-deadline",
    b"redrive-send-to",
    b"redrive-group",
    b"redrive-original-offset",
    b"redrive-original-timestamp",
    b"redrive-error-message",
    b"redrive-reason",
    b"redrive-\xff",
]
names = st.one_of(st.binary(max_size=24), st.sampled_from(CONTRACT_NAMES))
header_values = st.one_of(
    st.none(),
    st.binary(max_size=64),
    st.sampled_from([b"-1", b"0", b"9223372036854775807", b"99999999999999999999", b"\x00"]),
)
timestamps = st.one_of(
    st.none(), st.just(-5), st.integers(min_value=1, max_value=now_ms() - 60_000)
)


@st.composite
def hostile_records(draw: st.DrawFn) -> Hostile:
    headers = tuple(draw(st.lists(st.tuples(names, header_values), max_size=12)))
    value = draw(st.one_of(st.none(), st.binary(max_size=2048)))
    record = Hostile(
        key=draw(st.one_of(st.none(), st.binary(max_size=32))),
        value=value,
        headers=headers,
        timestamp=draw(timestamps),
        valid_request=draw(st.booleans()),
    )
    if record.needs_kcat():
        # kcat carries keys and headers as arguments (no NUL), splits a header at its
        # first "=", refuses an empty name and skips an empty value.
        def strip(raw: bytes) -> bytes:
            return raw.replace(b"\x00", b"\x01")

        def name(raw: bytes) -> bytes:
            return strip(raw).replace(b"=", b"-") or b"\xff"

        record = Hostile(
            key=None if record.key is None else strip(record.key),
            value=(record.value or b"v"),
            headers=tuple((name(n), None if v is None else strip(v)) for n, v in headers),
            timestamp=None,
            valid_request=record.valid_request,
        )
    return record


@dataclass
class Intake:
    service: RetryService
    database_url: str
    requests: str
    dest: str
    bootstrap: str
    collector: Collector


@pytest.fixture(scope="module")
def intake(bootstrap: str, database_url: str) -> Iterator[Intake]:
    from confluent_kafka.admin import AdminClient, NewTopic

    dest = f"hostile-dest-{now_ms()}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(dest, num_partitions=2)])[dest].result(timeout=30)
    db = fresh_database(database_url)
    svc_settings = settings_for(bootstrap, db, allowed_destinations=[dest])
    with running_service(svc_settings) as service:
        collector = Collector(bootstrap, dest)
        try:
            yield Intake(service, db, svc_settings.requests_topic, dest, bootstrap, collector)
        finally:
            collector.close()


_ids = itertools.count()


def _write(intake: Intake, record: Hostile, mark: bytes) -> None:
    lead: list[RawHeader] = []
    if record.valid_request:
        lead = [
            (DESTINATION.encode(), intake.dest.encode()),
            (RETRY_AT.encode(), str(now_ms()).encode()),
        ]
    headers = [*lead, *record.headers, (MARK.encode(), mark)]
    if record.needs_kcat():
        assert record.value
        kcat_produce(intake.bootstrap, intake.requests, record.key, record.value, headers)
        return
    kwargs: dict[str, Any] = {
        "key": record.key,
        "value": record.value,
        # A name that is UTF-8 (NUL included) goes through confluent-kafka as text.
        "headers": [(n.decode(), v) for n, v in headers],
    }
    if record.timestamp is not None:
        kwargs["timestamp"] = record.timestamp
    produce(intake.bootstrap, intake.requests, [kwargs])


def _marks_of(headers: list[tuple[str, bytes | None]]) -> list[bytes]:
    return [v for n, v in headers if n == MARK and v is not None]


def each_ends_delivered_or_dead(intake: Intake, records: list[Hostile]) -> None:
    """Write the records; each must end delivered or a dead letter, intake still up."""
    marks = [f"h{next(_ids)}".encode() for _ in records]
    for record, mark in zip(records, marks, strict=True):
        _write(intake, record, mark)

    def accounted() -> set[bytes]:
        seen = {m for d in intake.collector.received for m in _marks_of(d.headers)}
        for letter in dead_letters(intake.database_url):
            seen.update(_marks_of(unpack_headers(letter["headers"])))
        return seen

    def all_accounted() -> bool:
        # A crashed role stops the service: fail at once rather than wait it out.
        assert intake.service.readiness()["running"], "the service stopped"
        intake.collector.poll_until(len(intake.collector.received) + 1, 0.2)
        return set(marks) <= accounted()

    wait_until(all_accounted, 60, f"records {marks} to be delivered or dead-lettered")
    assert all(intake.service.readiness().values()), intake.service.readiness()
    # A delivered row is deleted by the transaction that settles its batch, which may
    # commit a moment after the delivery was read.
    wait_until(lambda: pending_count(intake.database_url) == 0, 30, "no pending row left")


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(records=st.lists(hostile_records(), min_size=1, max_size=6))
def test_generated_hostile_records_each_end_delivered_or_dead(
    intake: Intake, records: list[Hostile]
) -> None:
    each_ends_delivered_or_dead(intake, records)


def test_ten_thousand_headers_and_extreme_values_do_not_stop_intake(intake: Intake) -> None:
    many = Hostile(
        key=None,
        value=b"x",
        headers=tuple((f"h{i}".encode(), b"\x00" * (i % 3)) for i in range(10_000)),
        timestamp=-5,
        valid_request=True,
    )
    extremes = Hostile(
        key=b"",
        value=b"",
        headers=(
            (b"redrive-attempt", b"9223372036854775807"),
            (b"redrive-original-timestamp", b"9223372036854775807"),
            (b"redrive-partition", b"2147483648"),
            (b"a\x00b", b"\x00"),
        ),
        timestamp=None,
        valid_request=True,
    )
    each_ends_delivered_or_dead(intake, [many, extremes])
    # And a good request after them is still delivered.
    produce(
        intake.bootstrap,
        intake.requests,
        [{"key": b"good", "value": b"after", "headers": request_headers(intake.dest, now_ms())}],
    )
    wait_until(
        lambda: any(d.value == b"after" for d in intake.collector.poll_until(10**9, 0.2)),
        30,
        "the good request after the hostile ones",
    )


def test_a_dead_letter_the_dlq_topic_refuses_is_kept_and_intake_goes_on(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    """With mirror_dead_letters, a letter too large for the DLQ topic stays in the store
    (logged and counted) and intake goes on: it used to crash, again at every restart."""
    from confluent_kafka.admin import AdminClient, NewTopic

    dest = new_topic("mirror-dest")
    dlq = f"small-dlq-{now_ms()}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics(
        [NewTopic(dlq, num_partitions=1, config={"max.message.bytes": "2048"})]
    )
    created[dlq].result(30)
    db = fresh_database(database_url)
    svc_settings = settings_for(
        bootstrap, db, allowed_destinations=[dest], mirror_dead_letters=True, dlq_topic=dlq
    )
    big = bytes(range(256)) * 40  # 10 KB: stored, but beyond the DLQ topic's limit
    records = [
        {"key": b"big", "value": big, "headers": request_headers(dest, now_ms(), send_to="dlq")},
        {
            "key": b"small",
            "value": b"fits",
            "headers": request_headers(dest, now_ms(), send_to="dlq"),
        },
        {"key": b"good", "value": b"due", "headers": request_headers(dest, now_ms())},
    ]
    with running_service(svc_settings) as service:
        produce(bootstrap, svc_settings.requests_topic, records)
        mirrored = Collector(bootstrap, dlq)
        delivered = Collector(bootstrap, dest)
        try:
            assert [d.key for d in mirrored.poll_until(1, 30)] == [b"small"]
            assert [d.value for d in delivered.poll_until(1, 30)] == [b"due"]
            wait_until(lambda: len(dead_letters(db)) == 2, 30, "both dead letters stored")
            assert all(service.readiness().values()), service.readiness()
            refused = service.metrics.delivery_errors.labels("mirror_refused")._value.get()
        finally:
            mirrored.close()
            delivered.close()
    stored = {bytes(letter["msg_key"]): bytes(letter["msg_value"]) for letter in dead_letters(db)}
    assert stored == {b"big": big, b"small": b"fits"}
    assert refused == 1
