"""Records behind a key's short retry kept in the App (``Service(ordering="key")``),
against the real broker and retry service: handled in order once the head is done,
without a round trip through the service each; a kept record that fails becomes the
key's new head; while they are kept the group's committed position stays at the first
of them and names the later records dealt with; a long retry sends them to the service
as before."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, TopicPartition

from redrive import App, Message, Service
from redrive.consumer.done_ahead import decode
from tests.chaos.hand_offs import committed_hand_offs
from tests.integration.consumer_harness import (
    Calls,
    Flaky,
    retry_service,
    running_app,
    wait_for,
    waiting_partitions,
)
from tests.integration.service_harness import produce

pytestmark = pytest.mark.integration


def _app(
    bootstrap: str, topic: str, requests_topic: str, handler: Callable[..., None], policy: str
) -> App:
    app = App(
        bootstrap,
        group=f"g-{topic}",
        requests_topic=requests_topic,
        commit_interval_s=0.2,
    )
    app.add_handler(topic, handler, strategy=Service(ordering="key"), policy=policy)
    return app


def _hand_offs(bootstrap: str, requests_topic: str) -> dict[str, int]:
    """How many requests of each kind (retry, behind, release) the App committed."""
    kinds: Counter[str] = Counter()
    for (kind, _), count in committed_hand_offs(bootstrap, requests_topic).items():
        kinds[kind] += count
    return dict(kinds)


def test_records_behind_a_short_retry_are_kept_and_handled_in_order(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("kept-lines")
    calls = Calls()
    ok: list[bytes] = []

    def handler(message: Message) -> None:
        calls.add(message)
        if message.raw_value in (b"a1", b"a3") and message.attempt == 1:
            raise Flaky("fails once")
        assert message.raw_value is not None
        ok.append(message.raw_value)

    with retry_service(bootstrap, database_url, allowed_destinations=[topic]) as service:
        requests = service.settings.requests_topic
        with running_app(_app(bootstrap, topic, requests, handler, "1s x3")):
            produce(bootstrap, topic, [{"key": b"a", "value": b"a%d" % i} for i in range(1, 6)])
            produce(bootstrap, topic, [{"key": b"b", "value": b"b1"}])
            assert wait_for(lambda: sum(v.startswith(b"a") for v in ok) == 5, 40)
            # a3 failed when a1's line was handled: a4 and a5 waited behind it in turn.
            assert [v for v in ok if v.startswith(b"a")] == [b"a1", b"a2", b"a3", b"a4", b"a5"]
            assert [(c.value, c.attempt) for c in calls.items if c.key == b"a"] == [
                (b"a1", 1),
                (b"a1", 2),
                (b"a2", 1),
                (b"a3", 1),
                (b"a3", 2),
                (b"a4", 1),
                (b"a5", 1),
            ]
            assert ok.index(b"b1") < ok.index(b"a1")
        # Two heads, each retried and released; nothing went to the service behind them.
        assert _hand_offs(bootstrap, requests) == {"retry": 2, "release": 2}


def test_a_partition_at_its_bound_waits_for_room_and_loses_nothing(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("kept-full")
    keys, per_key = 40, 30  # each key's first record fails: 1,160 records behind heads
    ok: list[bytes] = []
    waited: list[float] = []

    def handler(message: Message) -> None:
        assert message.raw_value is not None
        if message.raw_value.endswith(b"-0") and message.attempt == 1:
            raise Flaky("fails once")
        ok.append(message.raw_value)

    # A backlog, there before the App starts: read faster than the heads come back.
    produce(
        bootstrap,
        topic,
        [
            {"key": b"k%d" % k, "value": b"k%d-%d" % (k, i)}
            for i in range(per_key)
            for k in range(keys)
        ],
    )
    with retry_service(bootstrap, database_url, allowed_destinations=[topic]) as service:
        requests = service.settings.requests_topic
        with running_app(_app(bootstrap, topic, requests, handler, "2s x3")) as app:

            def all_handled() -> bool:
                waited.append(waiting_partitions(app))
                return len(ok) >= keys * per_key

            assert wait_for(all_handled, 90), f"{len(ok)} of {keys * per_key} handled"
    # The partition reached its bound of kept records (500) and waited for the heads
    # to come back; no record was lost or handled twice.
    assert max(waited) == 1
    assert len(ok) == len(set(ok)) == keys * per_key
    for k in range(keys):
        assert [v for v in ok if v.startswith(b"k%d-" % k)] == [
            b"k%d-%d" % (k, i) for i in range(per_key)
        ]
    # The records that waited did not go through the service: only the heads did.
    assert _hand_offs(bootstrap, requests) == {"retry": keys, "release": keys}


def test_the_committed_position_waits_at_the_first_kept_record(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("kept-position")
    ok: list[bytes] = []

    def handler(message: Message) -> None:
        if message.raw_value == b"a1" and message.attempt < 3:
            raise Flaky("fails twice")
        assert message.raw_value is not None
        ok.append(message.raw_value)

    group = f"g-{topic}"
    with retry_service(bootstrap, database_url, allowed_destinations=[topic]) as service:
        requests = service.settings.requests_topic
        with running_app(_app(bootstrap, topic, requests, handler, "3s x3")):
            # Offsets 0 to 3: a1 fails, a2 is kept behind it, b1 and b2 are handled.
            produce(
                bootstrap, topic, [{"key": b"a", "value": b"a1"}, {"key": b"a", "value": b"a2"}]
            )
            produce(
                bootstrap, topic, [{"key": b"b", "value": b"b1"}, {"key": b"b", "value": b"b2"}]
            )
            assert wait_for(lambda: ok == [b"b1", b"b2"], 20)
            committed = _committed(bootstrap, group, topic)
            assert wait_for(lambda: committed() == (1, {2, 3}), 10), committed()
            assert wait_for(lambda: ok[-2:] == [b"a1", b"a2"], 30)
            assert wait_for(lambda: committed()[0] >= 4, 10), committed()


def _committed(bootstrap: str, group: str, topic: str) -> Callable[[], tuple[int, set[int]]]:
    """The group's committed offset of the topic's partition 0, and the offsets its
    metadata names as dealt with."""

    def read() -> tuple[int, set[int]]:
        reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        try:
            [tp] = reader.committed([TopicPartition(topic, 0)], timeout=10)
        finally:
            reader.close()
        return tp.offset, set(decode(tp.metadata, tp.offset))

    return read


def test_records_behind_a_long_retry_go_to_the_service(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("kept-long")
    ok: list[bytes] = []

    def handler(message: Message) -> None:
        if message.raw_value == b"a1" and message.attempt == 1:
            raise Flaky("fails once")
        assert message.raw_value is not None
        ok.append(message.raw_value)

    with retry_service(bootstrap, database_url, allowed_destinations=[topic]) as service:
        requests = service.settings.requests_topic
        with running_app(_app(bootstrap, topic, requests, handler, "6s x2")):
            produce(bootstrap, topic, [{"key": b"a", "value": b"a%d" % i} for i in range(1, 4)])
            assert wait_for(lambda: ok == [b"a1", b"a2", b"a3"], 40)
        assert _hand_offs(bootstrap, requests) == {"retry": 1, "behind": 2, "release": 3}
