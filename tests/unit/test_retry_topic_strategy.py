"""The ``retry-topic`` strategy (seed 000's single retry topic) without a broker: its
topic's name, its one tier keyed by the policy's longest delay, the group it needs,
and the ``deadline_from`` handler option."""

from __future__ import annotations

import pytest

from redrive import App, Message
from redrive.clock import now_ms
from redrive.consumer.routes import STRATEGIES, Route
from redrive.consumer.strategies import BY_NAME
from redrive.consumer.strategies.retry_topic import RetryTopic, longest_delay
from redrive.consumer.strategies.topics import TIER_CLOCK_SLACK_MS, tier_delays
from redrive.errors import ConfigError
from redrive.headers import RetryHeaders
from redrive.policy import Policy, policy
from redrive.router import FailedRecord
from redrive.topic_names import single_retry_topic

pytestmark = pytest.mark.unit

TOPIC = "billing.orders.retry.all"


def plain_handler(message: Message) -> None:
    pass


def route_for(chosen: Policy, group: str = "billing") -> Route:
    return Route("orders", plain_handler, chosen, RetryTopic(), group)


def test_the_topic_is_per_group_and_source_topic_and_no_tier() -> None:
    assert single_retry_topic("billing", "orders") == TOPIC
    assert BY_NAME["retry-topic"] is RetryTopic
    assert "retry-topic" in STRATEGIES and set(STRATEGIES) == set(BY_NAME)


@pytest.mark.parametrize(
    ("spec", "options", "longest"),
    [
        ("10s", {"max_duration": "5m"}, 10_000),
        ("10s x*", {"max_attempts": 4}, 10_000),
        ("1s, 5m x2, 30s", {}, 300_000),
        ("[10, 60, 300]", {}, 300_000),
        ("exponential 1s x2 max 5m", {"max_attempts": 20}, 300_000),
        ("exponential 1s x2 max 5m", {"max_attempts": 3}, 2_000),  # the limit comes first
        ("exponential 1s x2 max 5m jitter 0.5 retries 8", {}, 128_000),
        ("1m, 1s", {"max_attempts": 2}, 60_000),  # the 1s retry is never reached
    ],
)
def test_one_tier_keyed_by_the_longest_delay(
    spec: str, options: dict[str, object], longest: int
) -> None:
    route = route_for(policy(spec, **options))  # type: ignore[arg-type]
    assert route.tiers == {longest: TOPIC}
    assert route.topics() == {"orders": "source", TOPIC: "tier"}
    assert route.topics_to_create() == [TOPIC, "orders.dlq"]
    assert route.tier_delay_ms(TOPIC) == longest


def test_more_distinct_delays_than_the_topics_strategy_allows() -> None:
    many = policy(", ".join(f"{n}s" for n in range(1, 41)))  # 40 distinct delays
    with pytest.raises(ConfigError, match="40 retry topics"):
        tier_delays(many)
    assert route_for(many).tiers == {40_000: TOPIC}
    creeping = policy("exponential 1ms x1.01 retries 1000")  # hundreds of distinct delays
    assert longest_delay(creeping) == creeping.schedule.delay_ms(1000)
    assert route_for(creeping).tiers == {longest_delay(creeping): TOPIC}


def test_every_attempt_goes_to_the_one_topic_on_its_partition() -> None:
    route = route_for(policy("1s, 5m x2, 30s, 2s"))
    assert {route.tier_for(attempt) for attempt in range(1, 7)} == {TOPIC}
    failed = FailedRecord(
        topic=TOPIC,
        partition=3,
        offset=7,
        timestamp_ms=None,
        key=b"k",
        value=b"v",
        headers=[],
        delivery=None,
        attempt=4,
    )
    target = route.strategy.retry_to(route, failed, "redrive.requests")
    assert target is not None
    assert (target.topic, target.destination, target.partition) == (TOPIC, "orders", 3)


def test_a_record_waits_at_most_the_longest_delay_and_the_slack() -> None:
    route = route_for(policy("1s, 1m"))
    strategy = route.strategy

    def hold(due_in_ms: int) -> object:
        delivery = RetryHeaders(destination="orders", retry_at=now_ms() + due_in_ms)
        return strategy.wait_until_due(route, TOPIC, 0, 1, delivery)

    assert hold(-1) is None  # due: handled now
    assert hold(59_000) is not None  # a 1m retry waits
    assert hold(60_000 + TIER_CLOCK_SLACK_MS - 1_000) is not None
    assert hold(60_000 + TIER_CLOCK_SLACK_MS + 10_000) is None  # forged: handled now


def test_a_group_that_cannot_make_a_topic_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="not a legal Kafka topic name") as caught:
        route_for(policy("5s x3"), group="billing/eu")
    assert caught.value.setting == "group"
    assert "'billing/eu.orders.retry.all' (<group>.<topic>.retry.all)" in str(caught.value)
    with pytest.raises(ConfigError, match="not a legal Kafka topic name"):
        route_for(policy("5s x3"), group="g" * 240)


def test_deadline_from_is_passed_to_the_policy() -> None:
    app = App("127.0.0.1:1", group="items")
    app.add_handler(
        "update-item",
        plain_handler,
        strategy="retry-topic",
        policy="10s",
        max_duration="5m",
        deadline_from="record-timestamp",
    )
    app.add_handler("other", plain_handler, strategy="retry-topic", policy="1s x3")
    route = app.routes["update-item"]
    assert route.policy.deadline_from == "record-timestamp"
    assert route.policy.max_duration_ms == 300_000
    assert route.tiers == {10_000: "items.update-item.retry.all"}
    assert app.routes["other"].policy.deadline_from == "first-failure"  # the default


def test_a_bad_deadline_from_is_a_config_error_naming_it() -> None:
    app = App("127.0.0.1:1", group="items")
    with pytest.raises(ConfigError, match="deadline_from must be") as caught:
        app.add_handler(
            "orders",
            plain_handler,
            strategy="retry-topic",
            policy="10s",
            max_duration="5m",
            deadline_from="event-time",  # type: ignore[typeddict-item]
        )
    assert caught.value.setting == "policy for 'orders'"
    assert "'event-time'" in str(caught.value)
    assert "orders" not in app.routes
