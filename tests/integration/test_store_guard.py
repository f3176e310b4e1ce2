"""The store guard on a real broker: what a group's committed marks let a store do.

Each test puts the marks in the group's commits the way a service would (plain
commits with metadata), then assigns partitions to a consumer whose rebalance
callback is the guard's, and reads what it committed.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import Consumer, TopicPartition

from redrive.clock import now_ms
from redrive.deadlines import Deadline
from redrive.errors import ConfigError
from redrive.service import group_marks
from redrive.service.store_guard import StoreGuard
from tests.integration.service_harness import produce, settings_for

pytestmark = pytest.mark.integration

ME = uuid.uuid4().hex
OTHER = uuid.uuid4().hex
PARTITIONS = 3


class Group:
    """A requests topic of three partitions, with a record in each, and a group."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.settings = settings_for(bootstrap, "postgresql://unused", requests_topic=topic)
        self.topic = topic
        produce(
            bootstrap,
            topic,
            [{"value": f"v{p}".encode(), "partition": p} for p in range(PARTITIONS)],
        )

    def _client(self) -> Consumer:
        return Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.settings.group_id})

    def commit(self, marks: dict[int, str], offset: int = 0) -> None:
        """Commit `offset` with these metadata on these partitions, as no member."""
        client = self._client()
        try:
            wanted = [TopicPartition(self.topic, p, offset, metadata=m) for p, m in marks.items()]
            client.commit(offsets=wanted, asynchronous=False)
        finally:
            client.close()

    def committed(self) -> dict[int, tuple[int, str | None]]:
        client = self._client()
        try:
            asked = [TopicPartition(self.topic, p) for p in range(PARTITIONS)]
            return {tp.partition: (tp.offset, tp.metadata) for tp in client.committed(asked, 30)}
        finally:
            client.close()

    @contextmanager
    def member(self, store: str) -> Iterator[tuple[Consumer, Callable[[], int]]]:
        """A member whose partitions the guard of `store` checks; and a function that
        polls until it read a record of each partition (how many it read), or raises
        what the guard raised."""
        guard = StoreGuard(
            self.settings,
            store,
            "postgresql://db",
            threading.Event(),
            {"bootstrap.servers": self.bootstrap},
        )
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.settings.group_id,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([self.topic], on_assign=guard.on_assign)

        def read_all() -> int:
            read: set[int] = set()
            deadline = Deadline(60)
            while len(read) < PARTITIONS:
                assert not deadline.passed(), f"read only partitions {read}"
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    read.add(msg.partition())
            return len(read)

        try:
            yield consumer, read_all
        finally:
            consumer.close()


@pytest.fixture
def group(bootstrap: str, new_topic: Callable[..., str]) -> Group:
    return Group(bootstrap, new_topic("guarded", partitions=PARTITIONS))


def test_a_fresh_group_is_taken_for_the_store_and_read(group: Group) -> None:
    with group.member(ME) as (_, read_all):
        assert read_all() == PARTITIONS
    assert group.committed() == {p: (0, group_marks.settled(ME)) for p in range(PARTITIONS)}


def test_a_group_an_older_redrive_committed_is_taken_where_it_was(group: Group) -> None:
    group.commit({p: "" for p in range(PARTITIONS)}, offset=1)  # past each partition's record
    with group.member(ME) as (consumer, _):
        deadline = Deadline(60)
        while not consumer.assignment():  # the guard committed before it returned
            assert not deadline.passed(), "no partition was ever assigned"
            assert consumer.poll(0.2) is None  # each record was committed before
    assert group.committed() == {p: (1, group_marks.settled(ME)) for p in range(PARTITIONS)}


def test_a_group_another_store_holds_is_refused_and_left_as_it_was(group: Group) -> None:
    held = {0: group_marks.settled(OTHER), 1: "", 2: group_marks.settled(OTHER)}
    group.commit(held)
    with group.member(ME) as (_, read_all), pytest.raises(ConfigError) as refused:
        read_all()
    assert refused.value.setting.startswith("database_url, group_id, requests_topic")
    assert f"name store {OTHER}" in refused.value.problem
    assert f"{group.topic} partitions 0, 2" in refused.value.problem
    assert group.committed() == {p: (0, held[p]) for p in range(PARTITIONS)}


def test_a_store_claiming_the_group_now_keeps_another_out(group: Group) -> None:
    claimed = {1: group_marks.claim(OTHER, now_ms())}
    group.commit(claimed)
    with group.member(ME) as (_, read_all), pytest.raises(ConfigError) as refused:
        read_all()
    assert f"another store ({OTHER}) is taking consumer group" in refused.value.problem
    assert "lapses at" in refused.value.problem
    # It wrote no claim of its own.
    assert group.committed() == {0: (-1001, None), 1: (0, claimed[1]), 2: (-1001, None)}


def test_a_claim_left_behind_lapses(group: Group) -> None:
    group.commit({1: group_marks.claim(OTHER, now_ms() - group_marks.CLAIM_EXPIRY_MS - 1)})
    with group.member(ME) as (_, read_all):
        assert read_all() == PARTITIONS
    assert group.committed() == {p: (0, group_marks.settled(ME)) for p in range(PARTITIONS)}


def test_the_store_holding_the_group_writes_over_a_claim_it_finds(group: Group) -> None:
    # The claimer read the holder's mark after writing its claim: it refused.
    group.commit({0: group_marks.settled(ME), 2: group_marks.claim(OTHER, now_ms())})
    with group.member(ME) as (_, read_all):
        assert read_all() == PARTITIONS
    assert group.committed() == {p: (0, group_marks.settled(ME)) for p in range(PARTITIONS)}


def test_members_of_one_store_share_the_group(group: Group) -> None:
    with group.member(ME) as (first, _), group.member(ME) as (second, _):
        deadline = Deadline(60)
        while not (first.assignment() and second.assignment()):
            assert not deadline.passed(), "the two members never shared the partitions"
            first.poll(0.1)  # a refusal would raise here
            second.poll(0.1)
        shared = len(first.assignment()) + len(second.assignment())
    assert shared == PARTITIONS
    assert group.committed() == {p: (0, group_marks.settled(ME)) for p in range(PARTITIONS)}


# A member as intake is one: its client logs through a Python logger (debug lines, so
# that one is sure to come in the poll that ran the guard). In a process of its own:
# what this guards against aborts the process.
_LOGGING_MEMBER = """
import logging, sys, threading
from confluent_kafka import Consumer
from redrive.deadlines import Deadline
from redrive.service.store_guard import StoreGuard
from tests.integration.service_harness import settings_for

bootstrap, topic, group, store, partitions = sys.argv[1:]
settings = settings_for(bootstrap, "postgresql://unused", requests_topic=topic, group_id=group)
client_log = logging.getLogger("client")
client_log.addHandler(logging.NullHandler())
client_log.propagate = False
guard = StoreGuard(
    settings, store, "postgresql://db", threading.Event(), {"bootstrap.servers": bootstrap}
)
consumer = Consumer({
    "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
    "auto.offset.reset": "earliest", "logger": client_log, "debug": "cgrp,fetch",
})
consumer.subscribe([topic], on_assign=guard.on_assign)
read, deadline = set(), Deadline(30)
while len(read) < int(partitions) and not deadline.passed():
    msg = consumer.poll(0.2)
    if msg is not None and msg.error() is None:
        read.add(msg.partition())
consumer.close()
print("read", len(read))
"""


def test_a_member_whose_client_logs_through_python_survives_the_check(group: Group) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _LOGGING_MEMBER, group.bootstrap, group.topic]
        + [group.settings.group_id, ME, str(PARTITIONS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    last_line = done.stdout.strip().rsplit("\n", 1)[-1]  # after the guard's own log lines
    assert (done.returncode, last_line) == (0, f"read {PARTITIONS}"), done.stderr[-3000:]
    assert group.committed() == {p: (0, group_marks.settled(ME)) for p in range(PARTITIONS)}
