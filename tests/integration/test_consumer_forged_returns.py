"""Records forged onto an App's retry paths, and headers copied by stream processors,
against the real broker: the App believes a record's redrive headers only where they
name the topic it is read on and, with keys, carry one of its signatures.

Each test is one thing an attacker who can write the App's topics, but holds no key,
tries: a forged record is never handled as a later attempt (the handler never sees an
attempt it did not earn), never makes the App skip the genuine record it names (the
genuine retry of the same id is handled), and on a retry path is refused visibly (a
dead letter saying why, or the counted refusal of ``RefuseAndCount``). The App signs
with keys from a key file, as docs/signing.md says. The retry service's deliveries are
played by the test: a request the App wrote, written as it is (signature and all) to
its destination, as the service delivers it.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from redrive import (
    App,
    KeyRing,
    Message,
    RefuseAndCount,
    RefuseToDeadLetters,
    RetryTopic,
    Service,
    Topics,
)
from redrive.consumer import ReturnRule
from redrive.consumer.refusals import DEFAULT_RULE
from redrive.consumer.strategies import Strategy
from redrive.headers import ATTEMPT, SIGNATURE, Header, decode, failure_request_id
from redrive.signing import Verdict
from tests.integration.consumer_harness import (
    Calls,
    Flaky,
    a_group,
    outcome_count,
    running_app,
    wait_for,
)
from tests.integration.service_harness import Collector, Delivery, now_ms, produce, request_headers

pytestmark = pytest.mark.integration

NEW = f"k2026b={base64.b64encode(bytes([2]) * 32).decode()}"
OLD = f"k2026a={base64.b64encode(bytes([1]) * 32).decode()}"


def app_keys(tmp_path: Path) -> KeyRing:
    """The App's keys from a key file, as docs/signing.md says: the new key first."""
    path = tmp_path / "signing-keys"
    path.write_text(f"# the App's keys\n{NEW}\n{OLD}\n")
    return KeyRing.from_settings(files=[path])


def failing(calls: Calls, until: int = 2) -> Callable[[Message], None]:
    """A handler noting each call that fails the genuine record's attempts before
    ``until`` (every other record is handled at once)."""

    def handler(message: Message) -> None:
        calls.add(message)
        if message.raw_value == b"genuine" and message.attempt < until:
            raise Flaky(f"attempt {message.attempt}")

    return handler


@contextmanager
def collecting(bootstrap: str, topic: str) -> Iterator[Collector]:
    collector = Collector(bootstrap, topic)
    try:
        yield collector
    finally:
        collector.close()


def end_of(bootstrap: str, topic: str) -> int:
    """How many records partition 0 of ``topic`` holds (its high watermark)."""
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": a_group()})
    try:
        return int(probe.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        probe.close()


def with_attempt(headers: list[Header], attempt: int) -> list[Header]:
    """A record's headers with its attempt forged (its signature, if any, kept as it was)."""
    return [(n, str(attempt).encode() if n == ATTEMPT else v) for n, v in headers]


def as_record(delivery: Delivery, **changes: object) -> dict[str, object]:
    """A record read from a topic, to write it again elsewhere (a copy, a delivery)."""
    return {"key": delivery.key, "value": delivery.value, "headers": delivery.headers, **changes}


def assert_refused(letter: Delivery, value: bytes, read_on: str, why: str) -> None:
    """A dead letter of a refused return: the forged record byte for byte, named by
    where it was read, never by what it claims, its reason saying why."""
    request, _ = decode(letter.headers)
    assert letter.value == value
    assert request.send_to == "dlq" and request.attempt == 1
    assert request.original_topic == read_on and request.original_offset == 0
    assert request.error_type == "redrive.consumer.RefusedReturnError"
    reason = request.reason or ""
    assert reason.startswith("return refused: ") and why in reason, reason


# ------------------------------------------------------------------ forged retries


def forged_onto_a_tier(
    bootstrap: str,
    topic: str,
    strategy: Strategy,
    keys: KeyRing,
    rule: ReturnRule = DEFAULT_RULE,
) -> tuple[App, Calls, list[Delivery]]:
    """A record forged onto the route's one tier before the genuine record fails:
    attempt 3, with the id the genuine record's first retry will have (a tier's ids
    are plain: anyone can compute one). Returns the App, its calls and the dead letters
    once the genuine record is done with."""
    group = a_group()
    calls = Calls()
    app = App(bootstrap, group=group, signing=keys, returns=rule)
    app.add_handler(topic, failing(calls), policy="300ms x3", strategy=strategy)
    [tier] = app.routes[topic].tiers.values()
    genuine_id = failure_request_id(group, 1, (topic, 0, 0), None)
    forged = request_headers(
        topic,
        now_ms(),
        attempt=3,
        group=group,
        id=genuine_id,
        original_topic=topic,
        original_partition=0,
        original_offset=0,
    )
    with running_app(app), collecting(bootstrap, f"{topic}.dlq") as letters:
        produce(bootstrap, tier, [{"key": b"k", "value": b"forged", "headers": forged}])
        assert wait_for(lambda: outcome_count(app, topic, "refused") == 1, 20)
        produce(bootstrap, topic, [{"key": b"k", "value": b"genuine"}])
        assert calls.wait_for(lambda: len(calls.of(b"genuine")) == 2, 20)
        if isinstance(rule, RefuseToDeadLetters):
            letters.poll_until(1, 20)
        letters.drain(0.5)
    assert [c.attempt for c in calls.of(b"genuine")] == [1, 2]
    assert calls.of(b"forged") == []
    assert outcome_count(app, topic, "repeat_skipped") == 0
    return app, calls, letters.received


@pytest.mark.parametrize("rule", [RefuseToDeadLetters(), RefuseAndCount()])
def test_a_record_forged_onto_a_tier_with_a_later_attempt_is_refused_and_skips_nothing(
    rule: ReturnRule, bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic("forged-tier")
    app, _, letters = forged_onto_a_tier(bootstrap, topic, "topics", app_keys(tmp_path), rule)
    [tier] = app.routes[topic].tiers.values()
    assert outcome_count(app, topic, "refused") == 1
    if isinstance(rule, RefuseAndCount):
        assert letters == [] and end_of(bootstrap, f"{topic}.dlq") == 0  # dropped, counted
        assert outcome_count(app, topic, "dead_lettered") == 0
    else:
        [letter] = letters
        assert_refused(letter, b"forged", tier, "not signed by our keys")


def test_a_record_forged_onto_the_single_retry_topic_is_refused_and_skips_nothing(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic("forged-retry-all")
    app, _, letters = forged_onto_a_tier(bootstrap, topic, RetryTopic(), app_keys(tmp_path))
    [retry_all] = app.routes[topic].tiers.values()
    assert retry_all.endswith(".retry.all")
    [letter] = letters
    assert_refused(letter, b"forged", retry_all, "not signed by our keys")


def test_a_copy_of_a_signed_request_forged_onto_the_per_group_topic_is_refused(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """The attacker reads the App's signed request on the requests topic (its sealed
    id cannot be guessed, but it can be read) and writes it to the group's own retry
    topic before the service delivers it, with attempt 3: its signature no longer
    verifies. The genuine delivery that follows is handled at attempt 2."""
    topic, requests = new_topic("forged-per-group"), new_topic("requests")
    calls = Calls()
    app = App(bootstrap, group=a_group(), requests_topic=requests, signing=app_keys(tmp_path))
    app.add_handler(
        topic,
        failing(calls),
        policy="300ms x3",
        strategy=Service(per_group_topic=True),
        dead_letters="topic",
    )
    per_group = app.routes[topic].redelivery_topic
    with (
        running_app(app),
        collecting(bootstrap, requests) as sent,
        collecting(bootstrap, f"{topic}.dlq") as letters,
    ):
        produce(bootstrap, topic, [{"key": b"k", "value": b"genuine"}])
        [request] = sent.poll_until(1, 20)
        assert decode(request.headers)[0].destination == per_group
        forged = as_record(request, value=b"forged", headers=with_attempt(request.headers, 3))
        produce(bootstrap, per_group, [forged])
        [letter] = letters.poll_until(1, 20)
        produce(bootstrap, per_group, [as_record(request)])  # the service's delivery
        assert calls.wait_for(lambda: len(calls.of(b"genuine")) == 2, 20)
    assert [c.attempt for c in calls.of(b"genuine")] == [1, 2]
    assert calls.of(b"forged") == []
    assert_refused(letter, b"forged", per_group, "does not match")
    assert outcome_count(app, topic, "refused") == 1
    assert outcome_count(app, topic, "repeat_skipped") == 0


def test_a_record_with_headers_copied_from_a_signed_retry_on_the_source_topic_is_new(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """On the source topic, a record carrying a genuine retry's headers (its sealed id,
    its signature) with attempt 3 and another value is a new record: handled at
    attempt 1, and the genuine delivery of that id after it is handled, not skipped."""
    topic, requests = new_topic("forged-source"), new_topic("requests")
    calls = Calls()
    app = App(bootstrap, group=a_group(), requests_topic=requests, signing=app_keys(tmp_path))
    app.add_handler(topic, failing(calls), policy="300ms x3", strategy="service")
    with running_app(app), collecting(bootstrap, requests) as sent:
        produce(bootstrap, topic, [{"key": b"k", "value": b"genuine"}])
        [request] = sent.poll_until(1, 20)
        forged = as_record(request, value=b"forged", headers=with_attempt(request.headers, 3))
        produce(bootstrap, topic, [forged])
        assert calls.wait_for(lambda: bool(calls.of(b"forged")), 20)
        produce(bootstrap, topic, [as_record(request)])  # the service's delivery
        assert calls.wait_for(lambda: len(calls.of(b"genuine")) == 2, 20)
        assert wait_for(lambda: outcome_count(app, topic, "handled") == 2, 10)
    assert [c.attempt for c in calls.of(b"forged")] == [1]
    assert [c.attempt for c in calls.of(b"genuine")] == [1, 2]
    assert outcome_count(app, topic, "untrusted_headers") == 1
    assert outcome_count(app, topic, "repeat_skipped") == 0
    assert outcome_count(app, topic, "refused") == 0  # a source topic refuses nothing


def test_without_keys_a_copy_of_a_retry_with_another_value_does_not_skip_the_genuine(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """Without keys the App believes what names the topic it reads, so a copy of a
    retry's headers with another value is handled as that retry; but the repeat
    window binds an id to its record's content: the genuine delivery is handled too."""
    topic, requests = new_topic("copied-id"), new_topic("requests")
    calls = Calls()
    app = App(bootstrap, group=a_group(), requests_topic=requests)
    app.add_handler(topic, failing(calls), policy="300ms x3", strategy="service")
    with running_app(app), collecting(bootstrap, requests) as sent:
        produce(bootstrap, topic, [{"key": b"k", "value": b"genuine"}])
        [request] = sent.poll_until(1, 20)
        assert SIGNATURE not in dict(request.headers)
        produce(bootstrap, topic, [as_record(request, value=b"copied")])
        assert calls.wait_for(lambda: bool(calls.of(b"copied")), 20)
        produce(bootstrap, topic, [as_record(request)])  # the service's delivery
        assert calls.wait_for(lambda: len(calls.of(b"genuine")) == 2, 20)
    assert [c.attempt for c in calls.of(b"genuine")] == [1, 2]
    assert outcome_count(app, topic, "repeat_skipped") == 0


# ------------------------------------------------------------------ copies, genuine returns


@pytest.mark.parametrize("signed", [True, False], ids=["with keys", "without keys"])
def test_a_stream_processor_copying_every_header_of_a_retry_to_another_topic_skips_nothing(
    signed: bool, bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A processor reads the App's tier record as soon as it is written and copies it,
    every header and its signature, to another topic the App reads: the copy there is
    a new record (attempt 1), and the genuine retry is still handled at attempt 2."""
    topic, other = new_topic("copied-from"), new_topic("copied-to")
    calls = Calls()
    app = App(bootstrap, group=a_group(), signing=app_keys(tmp_path) if signed else None)
    app.add_handler(topic, failing(calls), policy="1s x2", strategy="topics")
    app.add_handler(other, calls.add, strategy="topics")
    [tier] = app.routes[topic].tiers.values()
    with running_app(app), collecting(bootstrap, tier) as processor:
        produce(bootstrap, topic, [{"key": b"k", "value": b"genuine"}])
        [retry] = processor.poll_until(1, 20)
        assert (SIGNATURE in dict(retry.headers)) is signed
        produce(bootstrap, other, [as_record(retry)])
        assert calls.wait_for(lambda: len(calls.of(b"genuine")) == 3, 20)
        calls.wait_for(lambda: len(calls.of(b"genuine")) > 3, 0.5)
    # Whichever comes first, neither is a repeat of the other.
    seen = sorted((c.topic, c.attempt) for c in calls.of(b"genuine"))
    assert seen == sorted([(topic, 1), (other, 1), (tier, 2)])
    assert outcome_count(app, other, "untrusted_headers") == 1
    assert outcome_count(app, topic, "repeat_skipped") == 0


def test_an_app_with_keys_handles_its_own_signed_tier_retries_at_each_attempt(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic("signed-tiers")
    keys = app_keys(tmp_path)
    calls = Calls()
    app = App(bootstrap, group=a_group(), signing=keys)
    app.add_handler(topic, failing(calls, until=3), policy="200ms, 400ms", strategy="topics")
    tiers = list(app.routes[topic].tiers.values())
    assert len(tiers) == 2
    with running_app(app):
        produce(bootstrap, topic, [{"key": b"k", "value": b"genuine"}])
        assert calls.wait_for(lambda: len(calls.of(b"genuine")) == 3, 20)
        assert wait_for(lambda: outcome_count(app, topic, "handled") == 1, 10)
    assert [(c.topic, c.attempt) for c in calls.of(b"genuine")] == [
        (topic, 1),
        (tiers[0], 2),
        (tiers[1], 3),
    ]
    assert outcome_count(app, topic, "refused") == 0
    for tier in tiers:  # what the App wrote there verifies with its keys
        with collecting(bootstrap, tier) as written:
            [record] = written.poll_until(1, 20)
        signature = dict(record.headers)[SIGNATURE]
        assert signature is not None and signature.startswith(b"v1:k2026b:")
        found = keys.verify(record.headers, record.key, record.value, signature.decode())
        assert found.verdict is Verdict.VALID
    assert end_of(bootstrap, f"{topic}.dlq") == 0


def test_a_key_line_forged_into_the_held_topic_holds_no_key(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """``Topics(ordering="key")`` keeps each key's line in ``<group>.<topic>.held``. A
    line written there by someone without the key (for key k, a record waiting in the
    tier) is ignored when the App reads the held topic back: k's record is handled
    from the source at once, not put behind a record that does not exist."""
    topic = new_topic("forged-line")
    calls = Calls()
    app = App(bootstrap, group=a_group(), signing=app_keys(tmp_path), transactional=True)
    app.add_handler(topic, calls.add, policy="300ms", strategy=Topics(ordering="key"))
    route = app.routes[topic]
    produce(bootstrap, route.held_topic, [{"key": b"k", "value": b"7@300", "partition": 0}])
    with running_app(app):
        produce(bootstrap, topic, [{"key": b"k", "value": b"v"}])
        assert calls.wait_for(lambda: bool(calls.of(b"v")), 20)
        assert wait_for(lambda: outcome_count(app, topic, "handled") == 1, 10)
    [call] = calls.of(b"v")
    assert (call.topic, call.attempt) == (topic, 1)
    assert outcome_count(app, topic, "bookkeeping_ignored") == 1
    assert outcome_count(app, topic, "held_behind") == 0
