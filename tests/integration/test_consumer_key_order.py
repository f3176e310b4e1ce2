"""Key order through non-blocking retries (``ordering="key"``), against the real broker
and retry service: while a record of a key waits for its retry, the later records of
that key wait behind it and are handled in order after it; other keys go on; the held
keys survive a restart of the App; a dead letter at the head lets the rest go. For each
keeper of the lines: the retry service (``service``), the tier topics (``topics``,
``retry-topic``, with transactions)."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from redrive import App, KeyRing, Message, RetryTopic, Service, Topics
from redrive.errors import ConfigError
from redrive.topic_names import per_group_retry_topic
from tests.integration.consumer_harness import (
    Calls,
    docs_example,
    outcome_count,
    retry_service,
    running_app,
    running_example,
    wait_for,
)
from tests.integration.service_harness import produce

pytestmark = pytest.mark.integration

SIGNING = KeyRing.from_settings([f"k1={base64.b64encode(bytes([5]) * 32).decode()}"])
"""The keys of the signed Apps: their key lines read back must verify."""


class Flaky(Exception):
    pass


class Broken(Exception):
    pass


def _records(key: bytes, values: list[bytes]) -> list[dict[str, bytes]]:
    return [{"key": key, "value": v} for v in values]


def _handled(calls: Calls, key: bytes, ok: set[tuple[bytes, int]]) -> list[bytes]:
    """The values of ``key`` whose handler call succeeded, in call order."""
    with calls.lock:
        return [c.value for c in calls.items if c.key == key and (c.value, c.attempt) in ok]


@pytest.mark.parametrize(
    ("strategy", "kind"),
    [
        ("service", "def"),
        ("service", "async def"),
        ("topics", "def"),
        ("topics", "async def"),
        ("retry-topic", "def"),
    ],
)
def test_later_records_of_a_key_wait_behind_its_retry(
    strategy: str, kind: str, bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("key-order")
    calls = Calls()
    succeeded: set[tuple[bytes, int]] = set()

    def plain(message: Message) -> None:
        calls.add(message)
        if message.raw_value == b"a1" and message.attempt < 3:
            raise Flaky("a1 fails twice")
        assert message.raw_value is not None
        succeeded.add((message.raw_value, message.attempt))

    async def awaited(message: Message) -> None:
        await asyncio.sleep(0.01)  # records of other keys run meanwhile
        plain(message)

    handler = plain if kind == "def" else awaited

    with retry_service(bootstrap, database_url, allowed_destinations=[topic]) as service:
        requests = service.settings.requests_topic
        with running_app(_app(bootstrap, topic, requests, handler, strategy)) as app:
            produce(bootstrap, topic, _records(b"a", [b"a1", b"a2", b"a3"]))
            produce(bootstrap, topic, _records(b"b", [b"b1", b"b2"]))
            assert wait_for(lambda: len(_handled(calls, b"a", succeeded)) == 3, 40)
            assert _handled(calls, b"a", succeeded) == [b"a1", b"a2", b"a3"]
            # a2 and a3 never reached the handler before a1 succeeded.
            assert [(c.value, c.attempt) for c in calls.items if c.key == b"a"] == [
                (b"a1", 1),
                (b"a1", 2),
                (b"a1", 3),
                (b"a2", 1),
                (b"a3", 1),
            ]
            # Key b did not wait for key a's retries: handled before a1's first retry.
            assert _handled(calls, b"b", succeeded) == [b"b1", b"b2"]
            order = [(c.value, c.attempt) for c in calls.items]
            assert order.index((b"b2", 1)) < order.index((b"a1", 2))
            assert outcome_count(app, topic, "held_behind") == 2
        # Once a is free, a new record of it goes straight to the handler.
        with running_app(_app(bootstrap, topic, requests, handler, strategy)) as again:
            produce(bootstrap, topic, _records(b"a", [b"a4"]))
            assert wait_for(lambda: (b"a4", 1) in succeeded, 20)
            assert outcome_count(again, topic, "held_behind") == 0


@pytest.mark.parametrize("per_group_topic", [False, True], ids=["source", "per-group topic"])
def test_a_record_failing_in_its_run_sends_the_rest_of_the_run_back_behind_it(
    per_group_topic: bool, bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    # An async handler sends the records behind a held key to the service, which
    # delivers them back together with their head (one run). a2 fails on its first
    # call, in that run: a3 and a4, delivered with it, wait again behind a2's retry
    # and are handled after it, once each (an App handling them from the failed run
    # would call a3 before a2's retry). The same when the runs come back on the group's
    # own topic: the App holds the key by its source partition.
    topic = new_topic("key-order-run")
    calls = Calls()
    succeeded: set[tuple[bytes, int]] = set()

    async def handler(message: Message) -> None:
        await asyncio.sleep(0.01)
        calls.add(message)
        if message.raw_value in (b"a1", b"a2") and message.attempt == 1:
            raise Flaky("fails once")
        assert message.raw_value is not None
        succeeded.add((message.raw_value, message.attempt))

    values = [b"a1", b"a2", b"a3", b"a4"]
    back_on = per_group_retry_topic(f"g-{topic}", topic) if per_group_topic else topic
    with retry_service(bootstrap, database_url, allowed_destinations=[back_on]) as service:
        requests = service.settings.requests_topic
        app = _app(bootstrap, topic, requests, handler, "service", "2s x3", per_group_topic)
        with running_app(app):
            produce(bootstrap, topic, _records(b"a", values))
            assert wait_for(lambda: len(_handled(calls, b"a", succeeded)) == 4, 60)
            assert [(c.value, c.attempt) for c in calls.items] == [
                (b"a1", 1),
                (b"a1", 2),
                (b"a2", 1),
                (b"a2", 2),
                (b"a3", 1),
                (b"a4", 1),
            ]


def test_records_another_producer_writes_to_a_tier_keep_no_line(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    # While a1 waits for its retry, records of key a that redrive did not write from the
    # source reach the tier: one without headers (failing once, so its own retry goes
    # out too) and one forging an ordered copy of the source's offset 0 (a1's) from
    # another topic. Neither joins a's line: each is handled, a2 follows a1, and the
    # key is free afterwards.
    topic = new_topic("key-order-foreign")
    tier = f"g-{topic}.{topic}.retry.2s"
    calls = Calls()
    succeeded: set[tuple[bytes, int]] = set()

    def handler(message: Message) -> None:
        calls.add(message)
        if message.raw_value in (b"a1", b"f1") and message.attempt == 1:
            raise Flaky("fails once")
        assert message.raw_value is not None
        succeeded.add((message.raw_value, message.attempt))

    forged = [
        ("redrive-destination", topic.encode()),
        ("redrive-retry-at", b"0"),
        ("redrive-attempt", b"1"),
        ("redrive-order", b"behind"),
        ("redrive-original-topic", b"elsewhere"),
        ("redrive-original-partition", b"0"),
        ("redrive-original-offset", b"0"),
    ]
    with running_app(_app(bootstrap, topic, "unused.requests", handler, "topics", "2s x3")) as app:
        produce(bootstrap, topic, _records(b"a", [b"a1"]))
        assert wait_for(lambda: any(c.value == b"a1" for c in calls.items), 20)
        produce(
            bootstrap,
            tier,
            [{"key": b"a", "value": b"f1"}, {"key": b"a", "value": b"f2", "headers": forged}],
        )
        produce(bootstrap, topic, _records(b"a", [b"a2"]))
        for value in (b"f1", b"f2", b"a2"):
            assert wait_for(lambda v=value: any(s[0] == v for s in succeeded), 30), value
        assert _handled(calls, b"a", {s for s in succeeded if s[0][:1] == b"a"}) == [b"a1", b"a2"]
        produce(bootstrap, topic, _records(b"a", [b"a3"]))
        assert wait_for(lambda: (b"a3", 1) in succeeded, 20)
        assert outcome_count(app, topic, "held_behind") == 1  # a2 alone


def _app(
    bootstrap: str,
    topic: str,
    requests_topic: str,
    handler: Callable[..., Any],
    strategy: str,
    policy: str = "1s x3",
    per_group_topic: bool = False,
) -> App:
    """Dead letters go to the service with every strategy (the test reads them there);
    the tier topics keep key lines only with transactions. ``"topics, signed"``: with
    signing keys, so that its tier records and key lines are signed and verified."""
    lines_in_tiers = strategy != "service"
    app = App(
        bootstrap,
        group=f"g-{topic}",
        requests_topic=requests_topic,
        transactional=lines_in_tiers,
        commit_interval_s=0.2,
        signing=SIGNING if strategy.endswith(", signed") else None,
    )
    ordered = (
        Service(ordering="key", per_group_topic=per_group_topic)
        if strategy == "service"
        else Topics(ordering="key")
    )
    app.add_handler(topic, handler, strategy=ordered, policy=policy, dead_letters="service")
    return app


@pytest.mark.parametrize("strategy", ["service", "topics", "topics, signed"])
def test_held_keys_survive_a_restart_and_a_dead_letter_lets_the_rest_go(
    strategy: str, bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("key-order-restart", partitions=2)
    calls = Calls()
    succeeded: set[tuple[bytes, int]] = set()

    def handler(message: Message) -> None:
        calls.add(message)
        if message.raw_value == b"k1":
            raise Flaky("k1 fails until its attempts run out")
        if message.raw_value == b"x1" and message.attempt == 1:
            raise Flaky("x1 fails once")
        assert message.raw_value is not None
        succeeded.add((message.raw_value, message.attempt))

    with retry_service(bootstrap, database_url, allowed_destinations=[topic]) as service:
        requests = service.settings.requests_topic
        with running_app(_app(bootstrap, topic, requests, handler, strategy)):
            produce(bootstrap, topic, _records(b"k", [b"k1", b"k2"]))
            produce(bootstrap, topic, _records(b"x", [b"x1", b"x2"]))
            assert wait_for(lambda: any(c.value == b"k1" for c in calls.items), 20)
            time.sleep(0.5)  # k2 read and put behind k1
        # Stopped while k1 waits for its retry (due 1 s after each failure): a new App
        # reads the held keys back, and k3 waits behind k1 and k2 too.
        with running_app(_app(bootstrap, topic, requests, handler, strategy)) as again:
            produce(bootstrap, topic, _records(b"k", [b"k3"]))
            assert wait_for(lambda: len(_handled(calls, b"k", succeeded)) == 2, 40)
            assert wait_for(lambda: len(_handled(calls, b"x", succeeded)) == 2, 20)
            # k1 ran out of attempts (a dead letter); k2 and k3 went on, in order.
            assert _handled(calls, b"k", succeeded) == [b"k2", b"k3"]
            assert [c.attempt for c in calls.items if c.value == b"k1"] == [1, 2, 3, 4]
            assert _handled(calls, b"x", succeeded) == [b"x1", b"x2"]
            assert outcome_count(again, topic, "dead_lettered") == 1
            # Its own key lines and tier records, signed or not, were believed.
            assert outcome_count(again, topic, "bookkeeping_ignored") == 0
            assert outcome_count(again, topic, "refused") == 0
        # Stored once the service's intake has read it.
        assert wait_for(lambda: len(service.store.dead_letters(limit=10)) == 1, 20)
        [letter] = service.store.dead_letters(limit=10)
        assert bytes(letter["msg_value"]) == b"k1"


def test_ordering_needs_a_strategy_that_keeps_key_lines(bootstrap: str) -> None:
    app = App(bootstrap, group="g-order-config")
    # Blocking and Pause have no ordering (mypy refuses it); an untyped caller is
    # told where it went.
    with pytest.raises(ConfigError, match=r'strategy=Service\(ordering="key"\)'):
        app.add_handler("t", lambda m: None, strategy="pause", ordering="key")  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="transactional=True"):
        app.add_handler("t", lambda m: None, strategy=Topics(ordering="key"))
    sticky = App(
        bootstrap,
        group="g-order-config",
        transactional=True,
        consumer_kafka={"partition.assignment.strategy": "cooperative-sticky"},
    )
    with pytest.raises(ConfigError, match=r"partition\.assignment\.strategy"):
        sticky.add_handler("t", lambda m: None, strategy=RetryTopic(ordering="key"))
    # Retries on a per-group topic (the default with key order): its partitions must
    # go with the source's; the error names the way back to the source topic too.
    for per_group in (Service(per_group_topic=True, ordering="key"), Service(ordering="key")):
        with pytest.raises(ConfigError, match="per-group retry topic") as refused:
            sticky.add_handler("t", lambda m: None, strategy=per_group)
        assert "per_group_topic=False" in refused.value.fix
    # A group whose retry topic could not be a topic is refused before anything runs.
    with pytest.raises(ConfigError, match="not a legal Kafka topic name"):
        App(bootstrap, group="g" * 250).add_handler(
            "t", lambda m: None, strategy=Service(ordering="key")
        )
    with pytest.raises(ConfigError, match="not an ordering"):
        Topics(ordering="partition")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="batch handlers"):
        app.add_batch_handler("t", lambda batch: None, strategy=Service(ordering="key"))
    assert app.routes == {} and sticky.routes == {}
    app.add_handler("t", lambda m: None, strategy=Service(ordering="key"))
    assert app.routes["t"].redelivery_topic == "g-order-config.t.retry"
    assert app.routes["t"].strategy == Service(per_group_topic=True, ordering="key")
    # Back on the source topic when asked: no per-group topic, any assignor.
    sticky.add_handler("t", lambda m: None, strategy=Service(ordering="key", per_group_topic=False))
    assert sticky.routes["t"].redelivery_topic == "t"
    # Without key order, retries come back on the source unless asked.
    app.add_handler("u", lambda m: None, strategy=Service())
    assert app.routes["u"].redelivery_topic == "u"


def test_the_docs_example_applies_each_orders_statuses_in_order(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("order-status")
    with retry_service(bootstrap, database_url, allowed_destinations=[topic]) as service:
        source = docs_example(
            "## Key order through retries",
            {
                '"localhost:9092"': repr(bootstrap),
                'group="shipping")': (
                    f"group={'g-' + topic!r}, requests_topic={service.settings.requests_topic!r})"
                ),
                '"order-status"': repr(topic),
            },
        )
        with running_example(source) as example:
            _statuses_come_in_order(bootstrap, topic, example)


def test_the_topics_docs_example_applies_each_orders_statuses_in_order(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("order-status-tiers")
    source = docs_example(
        "### Key order with the topics strategies",
        {
            '"localhost:9092"': repr(bootstrap),
            '"shipping"': repr(f"g-{topic}"),
            '"order-status"': repr(topic),
        },
    )
    with running_example(source) as example:
        _statuses_come_in_order(bootstrap, topic, example)
        assert outcome_count(example["app"], topic, "held_behind") >= 1


def _statuses_come_in_order(bootstrap: str, topic: str, example: dict[str, Any]) -> None:
    """The docs examples' orders: 7's SHIPPED fails once, DELIVERED waits behind it."""
    produce(bootstrap, topic, _records(b"7", [b"PAID", b"SHIPPED", b"DELIVERED"]))
    produce(bootstrap, topic, _records(b"9", [b"PAID", b"SHIPPED"]))
    statuses = example["statuses"]
    done = ["PAID", "SHIPPED", "DELIVERED"]
    assert wait_for(lambda: statuses.get("7") == done, 30), statuses
    assert wait_for(lambda: statuses.get("9") == ["PAID", "SHIPPED"], 30), statuses


@pytest.mark.parametrize("strategy", ["service", "topics"])
def test_held_keys_move_with_their_partition_to_an_instance_that_joins(
    strategy: str, bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    # Eight keys over two partitions, each first record failing (retried every 5 s)
    # until a second instance has joined the group and taken one partition: the held
    # keys of that partition, and what waits behind them, are the newcomer's now. A
    # third record of each key, produced once it joined, reaches the newcomer before
    # the head's next retry: it must wait, known held from the held-keys topic alone.
    topic = new_topic("key-order-join", partitions=2)
    keys = [b"k%d" % i for i in range(8)]
    joined = threading.Event()
    lock = threading.Lock()
    calls: list[tuple[str, bytes, bytes, int]] = []  # instance, key, value, attempt
    succeeded: list[tuple[bytes, bytes]] = []

    def handler_of(instance: str) -> Callable[[Message], None]:
        def handler(message: Message) -> None:
            assert message.key is not None and message.raw_value is not None
            with lock:
                calls.append((instance, message.key, message.raw_value, message.attempt))
            if message.raw_value.endswith(b"-1") and not joined.is_set():
                raise Flaky("each key's first record fails until the second instance joined")
            with lock:
                succeeded.append((message.key, message.raw_value))

        return handler

    def done(key: bytes) -> list[bytes]:
        with lock:
            return [v for k, v in succeeded if k == key]

    with retry_service(bootstrap, database_url, allowed_destinations=[topic]) as service:
        requests = service.settings.requests_topic
        first = _app(bootstrap, topic, requests, handler_of("first"), strategy, "5s x10")
        with running_app(first):
            for key in keys:
                produce(bootstrap, topic, _records(key, [key + b"-1", key + b"-2"]))
            assert wait_for(lambda: len({c[1] for c in calls}) == len(keys), 20)
            second = _app(bootstrap, topic, requests, handler_of("second"), strategy, "5s x10")
            with running_app(second):
                assert wait_for(lambda: _members_reading(bootstrap, f"g-{topic}", topic) == 2, 30)
                for key in keys:
                    produce(bootstrap, topic, _records(key, [key + b"-3"]))
                joined.set()
                assert wait_for(lambda: all(len(done(k)) == 3 for k in keys), 60)
    for key in keys:
        assert done(key) == [key + b"-1", key + b"-2", key + b"-3"], key
        values = [v for _, k, v, _ in calls if k == key]
        # Nothing behind the head reached a handler before the head succeeded.
        heads = values.count(key + b"-1")
        assert values == [key + b"-1"] * heads + [key + b"-2", key + b"-3"], values
    # The second instance took keys that the first held when it joined.
    moved = {k for i, k, v, a in calls if i == "second" and v.endswith(b"-1")}
    assert moved, "no held key changed hands: the test proves nothing"


def _members_reading(bootstrap: str, group: str, topic: str) -> int:
    """How many members of the group are assigned a partition of `topic`."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_consumer_groups([group])[group].result(timeout=10)
    return sum(
        1
        for member in described.members
        if any(tp.topic == topic for tp in member.assignment.topic_partitions)
    )
