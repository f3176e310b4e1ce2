"""Intake left out of its consumer group gets its partitions back, and loses nothing.

After a broker restart on a loaded machine, librdkafka kept intake's client out of
its group for good: its coordinator requests sat unsent, and subscribing again on
that client changed nothing. That state cannot be brought about on demand, so the
test stands in for it: intake's client is made one on which subscribing does nothing,
and intake is told its partitions were lost long enough ago to rejoin. What is
asserted is what the service owes its senders: a member of intake's group holds every
partition of the requests topic again, the requests sent before, during and after
are each delivered exactly once, and the new member read on from the offsets the
first one committed (it read nothing of theirs again).

The test watches the group from outside (an admin client) and never calls intake's
client from the test's thread: confluent-kafka lets one thread at a time into a
consumer, and intake's thread is in it almost all the time.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from redrive.membership import GroupConsumer
from redrive.service import intake as intake_module
from redrive.service.service import RetryService
from tests.integration.service_harness import (
    Collector,
    fresh_database,
    now_ms,
    produce,
    request_headers,
    running_service,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.integration


class WedgeableClient(GroupConsumer):
    """Intake's client, which the test can wedge: then subscribing does nothing, as
    for the client librdkafka kept out of its group."""

    wedged = False

    def subscribe(self, *args: Any, **kwargs: Any) -> None:
        if not self.wedged:
            super().subscribe(*args, **kwargs)


def holder(admin: AdminClient, group: str, topic: str, partitions: int) -> str | None:
    """The member of `group` assigned every partition of `topic`, if one is."""
    described = admin.describe_consumer_groups([group])[group].result(timeout=10)
    for member in described.members:
        assigned = member.assignment.topic_partitions if member.assignment else []
        if len({tp.partition for tp in assigned if tp.topic == topic}) == partitions:
            return str(member.member_id)
    return None


def unread(admin: AdminClient, group: str, topic: str, partitions: int) -> int:
    """How many records of `topic` are past `group`'s committed offsets."""
    wanted = [TopicPartition(topic, p) for p in range(partitions)]
    request = [ConsumerGroupTopicPartitions(group, wanted)]
    listed = admin.list_consumer_group_offsets(request)[group].result(timeout=10)
    committed = {tp.partition: max(tp.offset, 0) for tp in listed.topic_partitions}
    ends = admin.list_offsets({tp: OffsetSpec.latest() for tp in wanted})
    return sum(ends[tp].result(timeout=10).offset - committed[tp.partition] for tp in wanted)


def repeats(service: RetryService) -> float:
    """Requests intake read again and dropped as already stored."""
    return sum(
        sample.value
        for metric in service.metrics.registry.collect()
        if metric.name == "redrive_requests_repeated"
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


def test_intake_left_out_of_its_group_rejoins_and_loses_nothing(
    bootstrap: str,
    database_url: str,
    new_topic: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(intake_module, "GroupConsumer", WedgeableClient)
    destination = new_topic("rejoin", partitions=1)
    settings = settings_for(
        bootstrap, fresh_database(database_url), allowed_destinations=[destination]
    )
    group, topic = settings.group_id, settings.requests_topic
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def send(prefix: str, count: int) -> list[bytes]:
        keys = [f"{prefix}-{i}".encode() for i in range(count)]
        records = [
            {"key": key, "value": b"v", "headers": request_headers(destination, now_ms())}
            for key in keys
        ]
        produce(bootstrap, topic, records)
        return keys

    collector = Collector(bootstrap, destination)
    try:
        with running_service(settings) as service:
            intake = service.intake
            assert intake is not None
            partitions = len(admin.list_topics(topic, timeout=10).topics[topic].partitions)
            wait_until(
                lambda: holder(admin, group, topic, partitions) is not None,
                30,
                f"intake's group {group} assigned the {partitions} partitions of {topic}",
            )
            first = holder(admin, group, topic, partitions)
            before = send("before", 20)
            collector.poll_until(len(before), 30)
            wait_until(
                lambda: unread(admin, group, topic, partitions) == 0,
                30,
                "intake committed past the requests sent before",
            )

            intake.consumer.wedged = True  # type: ignore[attr-defined]
            intake.rejoin.lost(time.monotonic() - intake.rejoin.after_s)
            during = send("during", 10)
            wait_until(
                lambda: holder(admin, group, topic, partitions) not in (None, first),
                30,
                f"a new member of {group} holding the {partitions} partitions of {topic}",
            )
            after = send("after", 10)
            sent = [*before, *during, *after]
            collector.poll_until(len(sent), 30)
            delivered = Counter(d.key for d in collector.drain(quiet_s=2.0))
            wait_until(
                lambda: unread(admin, group, topic, partitions) == 0,
                30,
                "intake committed past every request",
            )
            read_again = repeats(service)
    finally:
        collector.close()
    missing = Counter(sent) - delivered
    twice = {key: n for key, n in delivered.items() if n > 1}
    assert not missing and not twice, f"not delivered: {missing}; more than once: {twice}"
    assert read_again == 0, "the new member read again what the first had committed"
