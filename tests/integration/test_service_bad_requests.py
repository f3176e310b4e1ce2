"""A catalogue of bad retry requests: each becomes a dead letter whose reason says what
was wrong, nothing is dropped, and the service keeps delivering good requests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from redrive.deadlines import Deadline
from tests.integration.service_harness import (
    Collector,
    dead_letters,
    fresh_database,
    now_ms,
    produce,
    request_headers,
    running_service,
    settings_for,
)

pytestmark = pytest.mark.integration


def catalogue(dest: str, other: str, requests_topic: str) -> list[tuple[str, dict[str, Any], str]]:
    """(name, record, text the dead letter's reason must contain)."""
    due = now_ms() + 1_000
    drop = b"<drop>"
    ok = {"redrive-destination": dest.encode(), "redrive-retry-at": str(due).encode()}

    def raw(**overrides: bytes | None) -> list[tuple[str, bytes | None]]:
        merged = {**ok, **{k.replace("_", "-"): v for k, v in overrides.items()}}
        return [(k, v) for k, v in merged.items() if v != drop]

    return [
        ("no headers at all", {"value": b"x"}, "redrive-destination: missing"),
        (
            "missing destination",
            {"value": b"x", "headers": raw(redrive_destination=drop)},
            "redrive-destination: missing",
        ),
        (
            "missing retry-at",
            {"value": b"x", "headers": raw(redrive_retry_at=drop)},
            "redrive-retry-at: missing",
        ),
        (
            "non-numeric retry-at",
            {"value": b"x", "headers": raw(redrive_retry_at=b"soon")},
            "redrive-retry-at: not a decimal integer",
        ),
        (
            "negative retry-at",
            {"value": b"x", "headers": raw(redrive_retry_at=b"-5")},
            "redrive-retry-at: must not be negative",
        ),
        ("attempt zero", {"value": b"x", "headers": raw(redrive_attempt=b"0")}, "redrive-attempt"),
        (
            "negative attempt",
            {"value": b"x", "headers": raw(redrive_attempt=b"-1")},
            "redrive-attempt: must not be negative",
        ),
        (
            "non-numeric partition",
            {"value": b"x", "headers": raw(redrive_partition=b"two")},
            "redrive-partition: not a decimal integer",
        ),
        (
            "partition beyond the topic",
            {"value": b"x", "headers": raw(redrive_partition=b"9")},
            "redrive-partition 9 does not exist",
        ),
        (
            "bad send-to",
            {"value": b"x", "headers": raw(redrive_send_to=b"later")},
            "redrive-send-to",
        ),
        (
            "null header value",
            {"value": b"x", "headers": raw(redrive_group=None)},
            "redrive-group: value is null",
        ),
        (
            "non-UTF-8 header value",
            {"value": b"x", "headers": raw(redrive_error_type=b"\xff\xfe\xfa")},
            "redrive-error-type: not valid UTF-8",
        ),
        (
            "duplicate header",
            {"value": b"x", "headers": [*raw(), ("redrive-retry-at", str(due).encode())]},
            "redrive-retry-at: appears more than once",
        ),
        (
            "misspelt redrive header",
            {"value": b"x", "headers": [*raw(), ("redrive-retryat", b"1")]},
            "redrive-retryat: unknown redrive header",
        ),
        (
            "huge error message",
            {"value": b"x", "headers": raw(redrive_error_message=b"E" * 5000)},
            "redrive-error-message: too long",
        ),
        (
            "huge trace",
            {"value": b"x", "headers": raw(redrive_error_trace=b"t" * 100_000)},
            "redrive-error-trace: too long",
        ),
        (
            "illegal topic name",
            {"value": b"x", "headers": raw(redrive_destination=b"a b/c")},
            "redrive-destination",
        ),
        (
            "topic name too long",
            {"value": b"x", "headers": raw(redrive_destination=b"a" * 300)},
            "redrive-destination",
        ),
        (
            "forged destination outside the allowlist",
            {"value": b"x", "headers": raw(redrive_destination=other.encode())},
            "destination not allowed",
        ),
        (
            "internal topic as destination",
            {"value": b"x", "headers": raw(redrive_destination=b"__consumer_offsets")},
            "destination not allowed",
        ),
        (
            "the requests topic itself (a loop)",
            {"value": b"x", "headers": raw(redrive_destination=requests_topic.encode())},
            "destination not allowed",
        ),
        (
            "unknown destination topic",
            {"value": b"x", "headers": raw(redrive_destination=f"{dest}-missing".encode())},
            "does not exist",
        ),
        (
            "deadline passed",
            {"value": b"x", "headers": raw(redrive_deadline=b"1000")},
            "deadline passed",
        ),
        (
            "due after its deadline",
            {
                "value": b"x",
                "headers": raw(
                    redrive_retry_at=str(due + 60_000).encode(),
                    redrive_deadline=str(due + 30_000).encode(),
                ),
            },
            "due after its deadline",
        ),
        (
            "retry-at ten years ahead",
            {
                "value": b"x",
                "headers": raw(redrive_retry_at=str(due + 10 * 365 * 86_400_000).encode()),
            },
            "days ahead",
        ),
        ("empty value", {"value": b"", "headers": raw()}, "empty value"),
        ("null value (tombstone)", {"value": None, "headers": raw()}, "empty value"),
        (
            "NUL bytes in texts (PostgreSQL text cannot hold them)",
            {
                "value": b"x",
                "headers": [
                    *raw(redrive_destination=b"nope", redrive_group=b"g\x00g"),
                    ("user\x00header", b"\x00"),
                ],
            },
            "destination not allowed",
        ),
        (
            "sent to the dead letters by its consumer",
            {"value": b"x", "headers": raw(redrive_send_to=b"dlq")},
            "redrive-send-to: dlq",
        ),
    ]


def test_each_bad_request_is_a_dead_letter_with_its_reason(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    dest = new_topic("allowed", partitions=2)
    other = new_topic("forbidden")
    db = fresh_database(database_url)
    settings = settings_for(bootstrap, db, allowed_destinations=[f"{dest}*"])
    cases = catalogue(dest, other, settings.requests_topic)
    assert len(cases) >= 20
    records = []
    for index, (_, record, _) in enumerate(cases):
        records.append({**record, "key": f"case-{index}".encode()})
    good_due = now_ms() + 1_500
    records.append(
        {"key": b"good", "value": b"still delivered", "headers": request_headers(dest, good_due)}
    )

    with running_service(settings) as service:
        produce(bootstrap, settings.requests_topic, records)
        deadline = Deadline(30)
        letters: list[dict[str, Any]] = []
        while not deadline.passed() and len(letters) < len(cases):
            time.sleep(0.2)
            letters = dead_letters(db)
        collector = Collector(bootstrap, dest)
        delivered = collector.poll_until(1, 15)
        collector.close()
        assert all(service.readiness().values()), service.readiness()

    by_key = {bytes(letter["msg_key"]): letter for letter in letters}
    problems = []
    for index, (name, record, expected) in enumerate(cases):
        letter = by_key.get(f"case-{index}".encode())
        if letter is None:
            problems.append(f"{name}: no dead letter")
            continue
        if expected not in letter["reason"]:
            problems.append(f"{name}: reason {letter['reason']!r} lacks {expected!r}")
        value = record.get("value")
        stored = None if letter["msg_value"] is None else bytes(letter["msg_value"])
        if stored != (value if value is not None else None):
            problems.append(f"{name}: value not kept")
        if letter["request_topic"] != settings.requests_topic:
            problems.append(f"{name}: request coordinates not kept")
    assert problems == []
    assert len(letters) == len(cases)  # exactly one dead letter each, nothing else
    assert [d.value for d in delivered] == [b"still delivered"]
