"""The dead-letter brake against the real broker, built from docs/consumer.md's
example: a burst of records that all fail fatally dead-letters up to the threshold,
then the brake opens (gauge, counter, /healthz degraded) and the route's records stay
where they are, unread and uncommitted; once the downstream is back a probe closes it
and every record ends handled or dead-lettered exactly once (the DLQ read to its end)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, TopicPartition

from redrive import App
from redrive.deadlines import Deadline
from redrive.topic_names import dead_letter_topic
from tests.integration.consumer_harness import (
    a_group,
    docs_example,
    outcome_count,
    running_example,
    wait_for,
)
from tests.integration.service_harness import Collector, produce

pytestmark = pytest.mark.integration

STATE = "redrive_consumer_dead_letter_brake_state"
OPENINGS = "redrive_consumer_dead_letter_brake_openings_total"
RECORDS = 40
THRESHOLD = 5


def sample(app: App, name: str, topic: str) -> float:
    return app.metrics.registry.get_sample_value(name, {"topic": topic}) or 0.0


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> int:
    """The group's committed offsets of ``topic``, added up (records past them)."""
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = probe.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=15)
        return sum(max(tp.offset, 0) for tp in tps)
    finally:
        probe.close()


def comes(predicate: Callable[[], bool], within_s: float) -> bool:
    """Whether ``predicate`` becomes true within ``within_s`` (for what must not come)."""
    deadline = Deadline(within_s)
    while not deadline.passed():
        if predicate():
            return True
    return predicate()


def healthz(app: App) -> tuple[int, dict[str, object]]:
    assert app.health_url is not None
    with urllib.request.urlopen(app.health_url, timeout=10) as response:
        body: dict[str, object] = json.loads(response.read())
        return response.status, body


VARIANTS = {
    "def": {},
    # Retried in place behind a circuit breaker: both hear each outcome.
    "pause": {'strategy="topics"': 'strategy="pause"'},
    # An async handler kept in key order: the brake holds records as they are taken.
    "async def, key order": {
        "def charge(": "async def charge(",
        'strategy="topics"': 'strategy=Topics(ordering="key")',
        "import App, DeadLetterBrake": "import App, Topics, DeadLetterBrake",
        "metrics_port=9464": "metrics_port=0, transactional=True",
    },
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_surge_of_dead_letters_opens_the_brake_and_nothing_is_lost_or_twice(
    variant: str, bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("brake", partitions=2)
    group = a_group()
    source = docs_example(
        "## The dead-letter brake",
        {
            '"localhost:9092"': repr(bootstrap),
            'group="billing"': f"group={group!r}",
            "metrics_port=9464": "metrics_port=0",
            '"orders"': repr(topic),
            "dead_letters=20": f"dead_letters={THRESHOLD}",
            'open_for="exponential 30s x2 max 10m"': 'open_for="3s"',
            **VARIANTS[variant],
        },
    )
    values = [f"order-{i}".encode() for i in range(RECORDS)]
    with running_example(source) as example:
        app: App = example["app"]
        charged: list[bytes] = example["charged"]
        example["payments_up"] = False  # the payment API goes down
        dlq = Collector(bootstrap, dead_letter_topic(topic))
        try:
            assert sample(app, STATE, topic) == 0
            produce(
                bootstrap,
                topic,
                [
                    {"key": b"k%d" % i, "value": value, "partition": i % 2}
                    for i, value in enumerate(values)
                ],
            )
            assert wait_for(lambda: sample(app, STATE, topic) == 1, 30), "the brake did not open"
            assert len(dlq.poll_until(THRESHOLD, 30)) >= THRESHOLD
            status, body = healthz(app)
            assert status == 200 and body["status"] == "degraded"
            brakes = body["dead_letter_brakes"]
            assert isinstance(brakes, dict) and brakes[topic]["state"] == "open"

            # While it is open: no more dead letters, nothing handled, and the group
            # commits only past the records dead-lettered (the rest wait unread).
            openings = sample(app, OPENINGS, topic)
            seen = len(dlq.received)
            more = comes(lambda: len(dlq.poll_until(RECORDS, 0.1)) > seen, 1.0)
            letters = len(dlq.received)
            committed_now = committed(bootstrap, group, topic, 2)
            if sample(app, OPENINGS, topic) == openings:  # no probe failed meanwhile
                assert not more, "dead-lettered while the brake was open"
                assert letters == THRESHOLD - 1 + openings
                assert committed_now <= letters, "committed past records not dealt with"
            assert not charged
            assert outcome_count(app, topic, "handled") == 0

            example["payments_up"] = True  # back: the next probe is handled
            assert wait_for(lambda: sample(app, STATE, topic) == 0, 30), "it did not close"
            assert wait_for(lambda: len(charged) + len(dlq.poll_until(RECORDS, 0.2)) >= RECORDS, 30)
            letters_after = dlq.drain(1.0)
        finally:
            dlq.close()
        openings = sample(app, OPENINGS, topic)
        assert openings >= 1
        # Each failed probe is one more dead letter, and one more opening.
        assert len(letters_after) == THRESHOLD - 1 + openings
        dead = [letter.value for letter in letters_after]
        assert len(set(dead)) == len(dead), "a record was dead-lettered twice"
        assert len(set(charged)) == len(charged), "a record was handled twice"
        assert sorted(dead + charged) == sorted(values)  # nothing lost, nothing twice
        status, body = healthz(app)
        assert status == 200 and body["status"] == "ok"
