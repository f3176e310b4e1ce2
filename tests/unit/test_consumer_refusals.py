"""What an App believes of the redrive headers it reads, without a broker: returns on a
retry path refused unless they name the topic read and (with keys) carry the App's
signature; copies on a source topic handled as new records; the repeat window bound
to content where an unsigned return may be believed; what the signing publisher
writes (every record signed, requests' ids sealed once); key order's bookkeeping
records verified where they are read; and the ``returns`` setting checked."""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Message as KafkaMessage

from redrive import App, KeyRing, Message, RefuseAndCount, RefuseToDeadLetters, ShareApp
from redrive.consumer.bookkeeping import BookkeepingCheck, sealed_headers
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.outcomes import Outcomes
from redrive.consumer.pipeline import Pipeline
from redrive.consumer.publisher import SigningPublisher
from redrive.consumer.refusals import DEFAULT_RULE, NOT_A_RETURN, ReturnRule, return_check
from redrive.consumer.repeats import RecentIds
from redrive.consumer.routes import Route, build_route
from redrive.consumer.settings import Hooks
from redrive.consumer.steps import KeyOrders, build_steps
from redrive.consumer.strategies.pause import Breakers
from redrive.errors import ConfigError
from redrive.headers import ID, SIGNATURE, Header, RetryHeaders, decode, encode
from redrive.signing import Verdict

pytestmark = pytest.mark.unit

GROUP = "billing"
KEYS = KeyRing.from_settings([f"k1={base64.b64encode(bytes([7]) * 32).decode()}"])
OTHER_KEYS = KeyRing.from_settings([f"k1={base64.b64encode(bytes([8]) * 32).decode()}"])


class FakePublisher:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, topic: str, **fields: Any) -> None:
        self.sent.append({"topic": topic, **fields})


def pipeline_for(
    keys: KeyRing | None, rule: ReturnRule = DEFAULT_RULE
) -> tuple[Pipeline, Route, FakePublisher, ConsumerMetrics]:
    route = build_route("orders", lambda m: None, GROUP, {"strategy": "topics"}, "1s")
    reads = {name: (route, kind) for name, kind in route.topics().items()}
    reads["events"] = (build_route("events", lambda m: None, GROUP, {}, "1s"), "source")
    publisher, metrics = FakePublisher(), ConsumerMetrics()
    unsigned = keys is None or rule.trust_unsigned
    outcomes = Outcomes(
        GROUP,
        "redrive.requests",
        publisher,  # type: ignore[arg-type]
        metrics,
        Hooks(),
        RecentIds(100, unsigned),
        False,
        rule,
        signing=keys is not None,
    )
    routes = [r for r, _ in reads.values()]
    steps = build_steps(
        list({r.topic: r for r in routes}.values()), KeyOrders(None, None), Breakers()
    )
    check = return_check(keys, rule)
    return (
        Pipeline(GROUP, reads, steps, outcomes, Breakers(), check=check),
        route,
        publisher,
        metrics,
    )


def returned(
    topic: str,
    destination: str = "orders",
    attempt: int = 2,
    value: bytes = b"v",
    keys: KeyRing | None = None,
    redrive_id: str = "ab" * 16,
) -> KafkaMessage:
    """A record read on ``topic`` carrying this group's redrive headers (signed with
    ``keys``, if given)."""
    request = RetryHeaders(
        destination=destination, retry_at=0, attempt=attempt, group=GROUP, id=redrive_id
    )
    headers = encode(request, [("trace", b"t")])
    if keys is not None:
        headers = keys.signed(headers, b"k", value)
    return KafkaMessage(
        topic=topic, partition=0, offset=5, key=b"k", value=value, headers=headers, timestamp=(1, 1)
    )


def plain(topic: str) -> KafkaMessage:
    return KafkaMessage(topic=topic, partition=0, offset=5, key=b"k", value=b"v", timestamp=(1, 1))


def prepared(records: Pipeline, record: KafkaMessage) -> Any:
    topic = record.topic()
    assert topic is not None
    steps, kind = records.reads[topic]
    return records.prepare(steps, kind, record, topic, 0, 5)


def count(metrics: ConsumerMetrics, outcome: str, topic: str = "orders") -> float:
    sample = metrics.registry.get_sample_value(
        "redrive_consumer_records_total", {"topic": topic, "outcome": outcome}
    )
    return sample or 0.0


# ---------------------------------------------------------------------- retry paths


def test_a_tier_record_signed_by_the_app_is_believed() -> None:
    records, route, publisher, metrics = pipeline_for(KEYS)
    [tier] = route.tiers.values()
    message = prepared(records, returned(tier, keys=KEYS))
    assert isinstance(message, Message) and message.attempt == 3
    assert message.retry is not None and message.headers == [("trace", b"t")]
    assert publisher.sent == [] and count(metrics, "refused") == 0


@pytest.mark.parametrize(
    ("record_of", "why"),
    [
        (lambda tier: returned(tier), "the request is not signed"),
        (lambda tier: returned(tier, keys=OTHER_KEYS), "does not match"),
        (lambda tier: returned(tier, destination="elsewhere", keys=KEYS), "a copy, not a return"),
        (plain, NOT_A_RETURN),
    ],
    ids=["unsigned", "another key", "another destination", "no redrive headers"],
)
def test_a_tier_record_the_app_cannot_believe_is_a_dead_letter_never_handled(
    record_of: Callable[[str], KafkaMessage], why: str
) -> None:
    records, route, publisher, metrics = pipeline_for(KEYS)
    [tier] = route.tiers.values()
    assert prepared(records, record_of(tier)) is None
    [letter] = publisher.sent
    assert letter["topic"] == "orders.dlq" and letter["value"] == b"v"
    assert letter["user_headers"] == ([] if why == NOT_A_RETURN else [("trace", b"t")])
    request: RetryHeaders = letter["redrive"]
    assert request.send_to == "dlq" and request.attempt == 1
    assert (request.original_topic, request.original_offset) == (tier, 5)  # where it was read
    assert request.reason is not None and request.reason.startswith("return refused: ")
    assert why in request.reason
    assert request.id is not None and request.id != "ab" * 16  # never the id it claims
    assert count(metrics, "refused") == 1 and count(metrics, "dead_lettered") == 0


def test_with_refuse_and_count_a_refused_return_is_counted_and_nothing_written() -> None:
    records, route, publisher, metrics = pipeline_for(KEYS, RefuseAndCount())
    [tier] = route.tiers.values()
    assert prepared(records, returned(tier, attempt=9)) is None
    assert publisher.sent == [] and count(metrics, "refused") == 1


def test_without_keys_a_tier_record_is_believed_where_it_names_its_route() -> None:
    records, route, publisher, _ = pipeline_for(None)
    [tier] = route.tiers.values()
    message = prepared(records, returned(tier))
    assert isinstance(message, Message) and message.attempt == 3
    first = prepared(records, plain(tier))  # without keys, as before: a first delivery
    assert isinstance(first, Message) and first.attempt == 1
    assert prepared(records, returned(tier, destination="elsewhere")) is None
    [letter] = publisher.sent
    assert "a copy, not a return" in (letter["redrive"].reason or "")
    assert letter["redrive"].reason_code is None  # a policy's codes only travel there


def test_trusting_unsigned_returns_believes_them_and_still_checks_signatures() -> None:
    records, route, publisher, _ = pipeline_for(KEYS, RefuseToDeadLetters(trust_unsigned=True))
    [tier] = route.tiers.values()
    assert isinstance(prepared(records, returned(tier)), Message)
    assert prepared(records, returned(tier, keys=OTHER_KEYS)) is None  # names our key id
    assert prepared(records, plain(tier)) is None  # no return at all
    assert len(publisher.sent) == 2


# ---------------------------------------------------------------------- source topics


def test_a_copy_on_a_source_topic_is_a_new_record_and_never_a_repeat() -> None:
    records, _, publisher, metrics = pipeline_for(KEYS)
    copy = returned("events", destination="orders", keys=KEYS)  # copied along by a processor
    message = prepared(records, copy)
    assert isinstance(message, Message)
    assert (message.attempt, message.retry) == (1, None)
    assert message.headers == [("trace", b"t")]
    assert count(metrics, "untrusted_headers", "events") == 1
    records.outcomes.repeats.add(records.outcomes.repeats.entry("ab" * 16, b"k", b"v"))
    assert isinstance(prepared(records, copy), Message)  # not looked up in the window
    assert publisher.sent == [] and count(metrics, "repeat_skipped", "events") == 0


def test_without_keys_the_window_binds_an_id_to_its_record() -> None:
    records, _, _, metrics = pipeline_for(None)
    window = records.outcomes.repeats
    window.add(window.entry("ab" * 16, b"k", b"copied value"))
    genuine = returned("events", destination="events")
    assert isinstance(prepared(records, genuine), Message)  # another value: not a repeat
    window.add(window.entry("ab" * 16, b"k", b"v"))
    assert prepared(records, genuine) is None
    assert count(metrics, "repeat_skipped", "events") == 1


def test_the_window_binds_content_only_where_asked() -> None:
    bound, unbound = RecentIds(10, binds_content=True), RecentIds(10, binds_content=False)
    assert unbound.entry("id", b"k", b"v") == "id"
    entries = {bound.entry("id", k, v) for k, v in [(b"k", b"v"), (b"k", b"w"), (None, b"kv")]}
    assert len(entries) == 3 and all(e.startswith("id:") for e in entries)
    assert bound.entry("id", b"", None) != bound.entry("id", None, b"")
    assert bound.entry("id", b"k", b"v") == bound.entry("id", b"k", b"v")


# ---------------------------------------------------------------------- what the App writes


class FakeProducer:
    def __init__(self) -> None:
        self.produced: list[tuple[str, bytes | None, list[Header]]] = []

    def produce(self, topic: str, value: Any, key: Any, *args: Any, headers: Any) -> None:
        self.produced.append((topic, key, list(headers)))

    def poll(self, timeout: float) -> int:
        return 0


def test_the_signing_publisher_signs_everything_and_seals_requests_ids_once() -> None:
    producer = FakeProducer()
    publisher = SigningPublisher(producer, threading.Event(), KEYS, "redrive.requests")  # type: ignore[arg-type]
    request = RetryHeaders(destination="orders", retry_at=1, attempt=1, group=GROUP, id="cd" * 16)
    for topic in ("redrive.requests", "billing.orders.retry.1s", "redrive.requests"):
        publisher.send(topic, key=b"k", value=b"v", user_headers=[("u", b"1")], redrive=request)
    publisher.put("billing.orders.held", key=b"k", value=b"12", partition=3)
    (_, _, first), (_, _, tier), (_, _, again), (held, _, kept) = producer.produced
    sealed = KEYS.sealed_id("cd" * 16)
    assert dict(first)[ID] == dict(again)[ID] == sealed.encode()  # a repeat: the same id
    assert dict(tier)[ID] == b"cd" * 16  # tier ids stay plain: the signature vouches
    for headers in (first, tier, again):
        signature = dict(headers)[SIGNATURE]
        assert signature is not None
        assert KEYS.verify(headers, b"k", b"v", signature.decode()).verdict is Verdict.VALID
        assert ("u", b"1") in headers
    assert decode(first)[0].id == sealed
    record = KafkaMessage(topic=held, partition=3, offset=0, key=b"k", value=b"12", headers=kept)
    assert BookkeepingCheck(KEYS).believed(record, "orders")


def bookkeeping(
    topic: str = "billing.orders.held",
    partition: int = 0,
    value: bytes | None = b"12",
    headers: list[Header] | None = None,
) -> KafkaMessage:
    return KafkaMessage(
        topic=topic, partition=partition, offset=4, key=b"k", value=value, headers=headers
    )


def test_a_bookkeeping_record_is_believed_only_where_the_app_signed_it() -> None:
    metrics = ConsumerMetrics()
    check = BookkeepingCheck(KEYS, records=metrics.records)
    signed = sealed_headers(KEYS, "billing.orders.held", 0, b"k", b"12")
    tombstone = sealed_headers(KEYS, "billing.orders.held", 0, b"k", None)
    assert check.believed(bookkeeping(headers=signed), "orders")
    assert check.believed(bookkeeping(value=None, headers=tombstone), "orders")
    refused = [
        bookkeeping(),  # unsigned
        bookkeeping(value=b"13", headers=signed),  # another value
        bookkeeping(value=None, headers=signed),  # a forged tombstone
        bookkeeping(partition=1, headers=signed),  # copied to another partition
        bookkeeping(topic="billing.other.held", headers=signed),  # or topic
        bookkeeping(headers=sealed_headers(OTHER_KEYS, "billing.orders.held", 0, b"k", b"12")),
    ]
    assert not any(check.believed(record, "orders") for record in refused)
    assert count(metrics, "bookkeeping_ignored") == len(refused)
    assert BookkeepingCheck(None).believed(bookkeeping(), "orders")  # no keys: as before
    assert BookkeepingCheck(KEYS, trust_unsigned=True).believed(bookkeeping(), "orders")


# ---------------------------------------------------------------------- the setting


@pytest.mark.parametrize(
    ("returns", "says"),
    [
        ("dead-letter", "is not a rule for refused returns"),
        (RefuseAndCount, "is not a rule for refused returns"),
        (RefuseAndCount(trust_unsigned="yes"), "is not True or False"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_returns_setting_stops_the_app_being_made(returns: Any, says: str) -> None:
    with pytest.raises(ConfigError, match=r"App\(returns=\.\.\.\)") as raised:
        App("localhost:1", group="g", signing=KEYS, returns=returns)
    assert says in str(raised.value)


def test_trusting_unsigned_returns_needs_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDRIVE_SIGNING_KEYS", raising=False)
    monkeypatch.delenv("REDRIVE_SIGNING_KEY_FILES", raising=False)
    rule = RefuseToDeadLetters(trust_unsigned=True)
    with pytest.raises(ConfigError, match="has none"):
        App("localhost:1", group="g", returns=rule)
    with pytest.raises(ConfigError, match=r"ShareApp\(returns=\.\.\.\)"):
        ShareApp("localhost:1", group="g", returns=rule)
    app = App("localhost:1", group="g", signing=KEYS, returns=rule)
    assert app.settings.returns == rule and app.settings.unsigned_returns
    assert App("localhost:1", group="g").settings.returns == RefuseToDeadLetters()
