"""Per-group retry topics, and the in-app strategies' dead letters in the retry service.

`Service(per_group_topic=True)` (the option is the `service` strategy's alone; an
untyped caller giving it to a handler is told where it went): the service then
delivers this group's retries to
`<group>.<topic>.retry`, which the App reads too, so that another consumer group
reading `<topic>` never sees them. Checked with two groups on one topic and the real
broker and service: group A fails some records, group B handles everything. "Never"
is checked after the fact: once A has handled all its retries, B is watched for a
while longer, and the broker's offsets say what was ever written to each topic. The
same run without `per_group_topic` shows B does get A's retries then, so the checks
can see a leak. The `topics` strategy's tiers are per group
(`<group>.<topic>.retry.<delay>`): B, with tiers of its own, never gets A's retries.

With `dead_letters="service"`, an in-app strategy's dead letter goes to the retry
service's store (the API and the UI show it), not to `<topic>.dlq`.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from redrive import App, FatalError, Message, Service
from redrive.consumer.routes import HandlerOptions, Strategy
from redrive.errors import ConfigError
from redrive.reasons import DeadLetterReason
from redrive.service.service import RetryService
from redrive.topic_names import dead_letter_topic, per_group_retry_topic
from tests.integration.consumer_harness import retry_service, running_app
from tests.integration.service_harness import dead_letters, pending_count, produce, wait_until

pytestmark = pytest.mark.integration

VALUES = [f"r{i}".encode() for i in range(10)]
FAILING = {b"r0", b"r3", b"r6", b"r9"}
"""A fails these at attempts 1 and 2 and handles them at attempt 3."""
POLICY = "300ms, 600ms"
RETRIES = 2 * len(FAILING)
QUIET_S = 3.0
"""How long B is watched once A handled its last retry and B its records. A retry
delivered where B reads reaches B within a poll or two (the control test)."""


class Flaky(Exception):
    pass


@dataclass(frozen=True)
class Seen:
    """One handler call, with what redrive told the handler of the record's past."""

    value: bytes | None
    attempt: int
    topic: str
    partition: int
    offset: int
    retry_group: str | None
    original_topic: str | None


@dataclass
class Log:
    """Thread-safe log of one app's handler calls."""

    items: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, m: Message) -> None:
        seen = Seen(
            m.raw_value,
            m.attempt,
            m.topic,
            m.partition,
            m.offset,
            m.retry.group if m.retry else None,
            m.retry.original_topic if m.retry else None,
        )
        with self.lock:
            self.items.append(seen)

    def all(self) -> list[Seen]:
        with self.lock:
            return list(self.items)

    def of(self, value: bytes) -> list[Seen]:
        return [s for s in self.all() if s.value == value]


@dataclass
class TwoGroups:
    """What two groups on one topic saw, and what the broker holds afterwards."""

    topic: str
    group_a: str
    group_b: str
    a: list[Seen]
    b: list[Seen]
    records_in: dict[str, int]
    """Records ever written to each topic derived from the source (and the source)."""


def a_is_done(log: Log) -> bool:
    """Every record handled by A: the failing ones at attempts 1, 2 and 3."""
    return all(
        [s.attempt for s in log.of(v)] == ([1, 2, 3] if v in FAILING else [1]) for v in VALUES
    )


def records_in(bootstrap: str, topic: str) -> dict[str, int]:
    """Each topic whose name holds `topic` (its own and the derived ones), with the
    number of records ever written to it: the sum of its partitions' high watermarks
    (the producers are idempotent, not transactional: one offset a record)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(timeout=15).topics
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        counts = {}
        for name, meta in metadata.items():
            if topic in name:
                counts[name] = sum(
                    probe.get_watermark_offsets(TopicPartition(name, p), timeout=15)[1]
                    for p in meta.partitions
                )
        return counts
    finally:
        probe.close()


def run_two_groups(
    bootstrap: str,
    database_url: str,
    new_topic: Callable[..., str],
    *,
    strategy: Strategy = "service",
    per_group_topic: bool = False,
    b_expects: int = len(VALUES),
) -> TwoGroups:
    """Group A fails the FAILING records twice, group B handles every record, both
    with `strategy` on one topic of two partitions (with `service`, one retry service
    for both). Returns once A handled every retry and B made `b_expects` calls and
    then none for QUIET_S (or more than `b_expects`)."""
    topic = new_topic("shared", partitions=2)
    tag = uuid.uuid4().hex[:8]
    group_a, group_b = f"a-{tag}", f"b-{tag}"
    allowed = [topic, per_group_retry_topic(group_a, topic), per_group_retry_topic(group_b, topic)]
    a_log, b_log = Log(), Log()

    def a_handler(message: Message) -> None:
        a_log.add(message)
        if message.raw_value in FAILING and message.attempt < 3:
            raise Flaky(f"attempt {message.attempt}")

    with ExitStack() as stack:
        requests_topic, db = None, None
        if strategy == "service":
            service = stack.enter_context(
                retry_service(bootstrap, database_url, allowed_destinations=allowed)
            )
            requests_topic, db = service.settings.requests_topic, service.database_url
        for group, handler in ((group_a, a_handler), (group_b, b_log.add)):
            app = App(bootstrap, group=group, requests_topic=requests_topic)
            options: HandlerOptions = {"policy": POLICY, "strategy": strategy}
            if per_group_topic:
                options["strategy"] = Service(per_group_topic=True)
            app.add_handler(topic, handler, **options)
            stack.enter_context(running_app(app))
        produce(
            bootstrap,
            topic,
            [{"key": v, "value": v, "headers": [("trace", v)]} for v in VALUES],
        )
        wait_until(lambda: a_is_done(a_log), 60, "A to handle every record and retry")
        wait_until(lambda: len(b_log.all()) >= b_expects, 30, f"B to make {b_expects} calls")
        # Then B is watched for QUIET_S more: nothing else may come.
        deadline = time.monotonic() + QUIET_S
        while time.monotonic() < deadline and len(b_log.all()) == b_expects:
            time.sleep(0.05)
    if db is not None:
        assert pending_count(db) == 0
        assert dead_letters(db) == []
    return TwoGroups(
        topic,
        group_a,
        group_b,
        a_log.all(),
        b_log.all(),
        records_in(bootstrap, topic),
    )


# ------------------------------------------------------------ which strategies take it


@pytest.mark.parametrize("strategy", ["blocking", "pause", "topics", "service"])
def test_per_group_topic_is_the_service_strategys_own_option(strategy: Strategy) -> None:
    app = App("localhost:1", group="g")
    app.add_handler("orders", lambda m: None, strategy=Service(per_group_topic=True))
    assert app.routes["orders"].redelivery_topic == per_group_retry_topic("g", "orders")
    app.add_handler("shipments", lambda m: None, strategy=Service())
    assert app.routes["shipments"].redelivery_topic == "shipments"
    # Given to a handler as before (which mypy refuses), it is a ConfigError that
    # says where it went, whatever the strategy.
    with pytest.raises(ConfigError, match=r"use strategy=Service\(per_group_topic=True\)"):
        app.add_handler(
            "payments",
            lambda m: None,
            strategy=strategy,
            per_group_topic=True,  # type: ignore[call-arg]
        )
    assert "payments" not in app.routes


# ------------------------------------------------------------ two groups, one topic


def test_another_group_never_sees_this_groups_per_group_retries(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    run = run_two_groups(bootstrap, database_url, new_topic, per_group_topic=True)
    topic = run.topic
    retry_a = per_group_retry_topic(run.group_a, topic)
    retry_b = per_group_retry_topic(run.group_b, topic)
    assert retry_a == f"{run.group_a}.{topic}.retry"

    # A: every failing record back at attempts 2 and 3, from A's own retry topic, as
    # A's retry of the original record.
    for value in VALUES:
        calls = [(s.attempt, s.topic) for s in run.a if s.value == value]
        if value in FAILING:
            assert calls == [(1, topic), (2, retry_a), (3, retry_a)], value
        else:
            assert calls == [(1, topic)], value
    for seen in run.a:
        if seen.attempt > 1:
            assert (seen.retry_group, seen.original_topic) == (run.group_a, topic)

    # B: every source record exactly once, as a first delivery, from the source topic,
    # and nothing after A's retries were all delivered and handled.
    assert sorted(s.value or b"" for s in run.b) == sorted(VALUES)
    assert len({(s.partition, s.offset) for s in run.b}) == len(VALUES)
    assert {(s.topic, s.attempt, s.retry_group) for s in run.b} == {(topic, 1, None)}

    # The broker: the retries went to A's per-group topic only; the source topic holds
    # the records produced and nothing else (no retry was ever written there); no other
    # topic was derived from it (no `<topic>.retry...`, no dead-letter topic).
    assert run.records_in == {topic: len(VALUES), retry_a: RETRIES, retry_b: 0}


def test_without_per_group_topic_the_other_group_gets_the_retries_too(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    """The control: the same run with retries delivered back to the shared topic. B
    handles each of A's retries as a record new to B (`read_delivery`: another group's
    retry is a first delivery), so the checks above would see a leak."""
    run = run_two_groups(bootstrap, database_url, new_topic, b_expects=len(VALUES) + RETRIES)
    topic = run.topic
    for value in FAILING:
        assert [(s.attempt, s.topic) for s in run.a if s.value == value] == [
            (1, topic),
            (2, topic),
            (3, topic),
        ]
        assert [(s.attempt, s.retry_group) for s in run.b if s.value == value] == [(1, None)] * 3
    assert len(run.b) == len(VALUES) + RETRIES
    assert run.records_in == {topic: len(VALUES) + RETRIES}


def test_with_the_topics_strategy_another_group_never_sees_this_groups_retries(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    run = run_two_groups(bootstrap, database_url, new_topic, strategy="topics")
    topic = run.topic
    for value in FAILING:  # A itself gets its retries from its tiers
        assert [s.attempt for s in run.a if s.value == value] == [1, 2, 3]
        assert {s.topic for s in run.a if s.value == value and s.attempt > 1} == {
            f"{run.group_a}.{topic}.retry.300ms",
            f"{run.group_a}.{topic}.retry.600ms",
        }
    # B sees each source record once, never one of A's retries (B's own tiers, empty).
    assert sorted(s.value or b"" for s in run.b) == sorted(VALUES)
    assert {s.topic for s in run.b} == {topic}
    assert all(s.attempt == 1 for s in run.b)


# ------------------------------------------------------------ in-app dead letters to the service


@contextmanager
def api_of(service: RetryService) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as client:
        yield client


def letters_of(api: httpx.Client, topic: str) -> list[dict[str, Any]]:
    response = api.get("/api/v1/dead-letters", params={"topic": topic})
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


@pytest.mark.parametrize("strategy", ["blocking", "pause", "topics"])
def test_an_in_app_strategys_dead_letter_goes_to_the_service_store_not_the_dlq_topic(
    strategy: Strategy, bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(f"dl-{strategy}", partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    log = Log()

    def handler(message: Message) -> None:
        log.add(message)
        if message.raw_value == b"poison":
            raise FatalError("cannot ever work")

    records = [
        {"key": b"k-1", "value": value, "headers": [("trace", value)]}
        for value in (b"ok-1", b"poison", b"ok-2")
    ]
    with retry_service(bootstrap, database_url, allowed_destinations=[topic]) as service:
        app = App(bootstrap, group=group, requests_topic=service.settings.requests_topic)
        app.add_handler(topic, handler, policy="1s", strategy=strategy, dead_letters="service")
        with running_app(app), api_of(service) as api:
            produce(bootstrap, topic, records)
            wait_until(lambda: len(letters_of(api, topic)) >= 1, 30, "the dead letter in the store")
            wait_until(lambda: len(log.all()) >= 3, 20, "every record to reach the handler")
            (letter,) = letters_of(api, topic)
            detail = api.get(f"/api/v1/dead-letters/{letter['id']}").json()
            page = api.get(f"/dead-letters/{letter['id']}")
        assert pending_count(service.database_url) == 0
        stored = dead_letters(service.database_url)

    (poison,) = [s for s in log.all() if s.value == b"poison"]
    assert sorted(s.value or b"" for s in log.all()) == [b"ok-1", b"ok-2", b"poison"]
    assert letter["group"] == group and letter["topic"] == topic
    assert letter["reason_code"] == DeadLetterReason.FATAL_ERROR  # not just "sent"
    assert "after attempt 1: fatal error: redrive.policy.FatalError" in letter["reason"]
    assert letter["error_type"].endswith("FatalError")
    assert "cannot ever work" in letter["error_message"]
    assert letter["attempt"] == 1
    assert detail["original"]["topic"] == topic
    assert (detail["original"]["partition"], detail["original"]["offset"]) == (
        poison.partition,
        poison.offset,
    )
    assert (detail["key"]["text"], detail["value"]["text"]) == ("k-1", "poison")
    assert {"name": "trace", "text": "poison", "base64": "cG9pc29u"} in detail["headers"]
    assert len(stored) == 1 and stored[0]["id"] == letter["id"]
    assert page.status_code == 200 and topic in page.text  # the UI shows it
    # Not on `<topic>.dlq`: never even created (the dev broker creates a topic on its
    # first produce, so nothing was written there either).
    assert dead_letter_topic(topic) not in records_in(bootstrap, topic)
