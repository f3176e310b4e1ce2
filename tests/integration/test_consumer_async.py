"""``async def`` handlers against the real broker: many records in flight at once,
within ``max_in_flight``; one record of a key (or, for strategies that retry in place,
of a partition) at a time, in order; every record handled once; positions committed
only past what was dealt with, so a stop mid-flight and a restart lose nothing and
hand nothing twice."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from redrive import App, Message
from tests.integration.consumer_harness import (
    docs_example,
    outcome_count,
    running_app,
    running_example,
    wait_for,
)
from tests.integration.service_harness import Collector, produce

pytestmark = pytest.mark.integration

POLICY = "300ms x3"


class Flaky(Exception):
    pass


@dataclass
class Watch:
    """What the async handler saw (all on the App's one thread; the lock is for the
    test's thread reading it)."""

    lane: Callable[[Message], object]
    fail_first: int = 0
    """How many first attempts of a failing record fail."""
    failing: set[bytes] = field(default_factory=set)
    delay_s: tuple[float, float] = (0.0, 0.004)
    starts: dict[object, list[tuple[bytes, int]]] = field(default_factory=lambda: defaultdict(list))
    handled: list[bytes] = field(default_factory=list)
    running: dict[object, int] = field(default_factory=lambda: defaultdict(int))
    overlaps: list[object] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def __call__(self, message: Message) -> None:
        lane = self.lane(message)
        value = message.raw_value or b""
        with self.lock:
            if self.running[lane]:
                self.overlaps.append(lane)
            self.running[lane] += 1
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.starts[lane].append((value, message.attempt))
        try:
            await asyncio.sleep(random.uniform(*self.delay_s))
            if value in self.failing and message.attempt <= self.fail_first:
                raise Flaky(f"{value!r} attempt {message.attempt}")
            with self.lock:
                self.handled.append(value)
        finally:
            with self.lock:
                self.running[lane] -= 1
                self.in_flight -= 1

    def handled_count(self) -> int:
        with self.lock:
            return len(self.handled)


def by_key(message: Message) -> object:
    return message.key


def by_partition(message: Message) -> object:
    return message.partition


def records(n: int, keys: int) -> list[dict[str, bytes]]:
    return [{"key": b"k-%02d" % (i % keys), "value": b"v-%04d" % i} for i in range(n)]


def test_an_async_handler_keeps_key_order_and_handles_every_record_once(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("async-keys", partitions=4)
    group = f"g-{uuid.uuid4().hex[:8]}"
    produced = records(1000, keys=50)
    values = [r["value"] for r in produced]
    watch = Watch(by_key, fail_first=2, failing=set(values[::10]))  # 10% fail twice
    app = App(bootstrap, group=group, max_in_flight=64)
    app.add_handler(topic, watch, strategy="topics", policy=POLICY)
    with running_app(app):
        produce(bootstrap, topic, produced)
        assert wait_for(lambda: watch.handled_count() >= 1000, 90), watch.handled_count()
        wait_for(lambda: watch.handled_count() > 1000, 1.5)  # no more come
    assert sorted(watch.handled) == sorted(values), "not every record handled exactly once"
    assert watch.overlaps == [], f"a key ran two records at once: {watch.overlaps[:5]}"
    assert 1 < watch.most_in_flight <= 64, watch.most_in_flight
    failing = set(values[::10])
    for key, starts in watch.starts.items():
        firsts = [v for v, attempt in starts if attempt == 1]
        assert firsts == sorted(firsts), f"key {key!r} started out of order"
        for value in {v for v, _ in starts} & failing:
            assert [a for v, a in starts if v == value] == [1, 2, 3], value


def test_an_async_handler_in_place_keeps_partition_order(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("async-blocking", partitions=4)
    group = f"g-{uuid.uuid4().hex[:8]}"
    produced = [{"value": b"v-%04d" % i, "partition": i % 4} for i in range(200)]
    values = [r["value"] for r in produced]
    watch = Watch(by_partition, fail_first=2, failing=set(values[::10]))
    app = App(bootstrap, group=group)
    app.add_handler(topic, watch, strategy="blocking", policy=POLICY)
    with running_app(app):
        produce(bootstrap, topic, produced)  # type: ignore[arg-type]
        assert wait_for(lambda: watch.handled_count() >= 200, 90), watch.handled_count()
        wait_for(lambda: watch.handled_count() > 200, 1.0)
    assert sorted(watch.handled) == sorted(values)
    assert watch.overlaps == [], f"a partition ran two records at once: {watch.overlaps[:5]}"
    assert watch.most_in_flight > 1, "the partitions did not run concurrently"
    for partition in range(4):
        mine = [v for v in values if int(v[2:]) % 4 == partition]
        done = [v for v in watch.handled if int(v[2:]) % 4 == partition]
        assert done == mine, f"partition {partition} handled out of order"
        starts = watch.starts[partition]
        for value in set(mine) & watch.failing:
            # Retried in place: attempts 1, 2, 3 in a row, nothing of its partition between.
            at = starts.index((value, 1))
            assert starts[at : at + 3] == [(value, 1), (value, 2), (value, 3)], value


def test_a_stop_mid_flight_then_a_restart_hands_each_record_once(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """Stopped with records running and queued: the App deals with what it took before
    it commits, and the restarted App hands exactly the rest: none twice, although a
    key's records end out of offset order."""
    topic = new_topic("async-stop", partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    produced = records(300, keys=30)
    values = [r["value"] for r in produced]
    first = Watch(by_key, delay_s=(0.02, 0.04))
    app = App(bootstrap, group=group, max_in_flight=20)
    app.add_handler(topic, first, strategy="service")
    with running_app(app):
        produce(bootstrap, topic, produced)
        assert wait_for(lambda: first.handled_count() >= 60, 60)
    assert first.handled_count() < 300, "everything ended before the stop: nothing shown"
    assert first.most_in_flight <= 20
    second = Watch(by_key)
    app = App(bootstrap, group=group)
    app.add_handler(topic, second, strategy="service")
    with running_app(app):
        rest = 300 - first.handled_count()
        assert wait_for(lambda: second.handled_count() >= rest, 60), second.handled_count()
        wait_for(lambda: second.handled_count() > rest, 1.5)
    assert sorted(first.handled + second.handled) == sorted(values)


def test_records_that_fail_for_good_are_dead_letters(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("async-dead", partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    dead: list[tuple[bytes | None, str]] = []

    async def handler(message: Message) -> None:
        await asyncio.sleep(0)
        if message.raw_value == b"bad":
            raise ValueError("bad record")

    app = App(
        bootstrap,
        group=group,
        on_dead_letter=lambda m, d, e: dead.append((m.raw_value if m else None, d.text)),
    )
    app.add_handler(topic, handler, strategy="topics", policy="200ms x1")
    with running_app(app):
        produce(bootstrap, topic, [{"key": b"k", "value": v} for v in (b"ok", b"bad", b"ok2")])
        assert wait_for(lambda: len(dead) == 1, 30), dead
    assert dead[0][0] == b"bad" and "attempts" in dead[0][1], dead


def test_a_rebalance_mid_flight_loses_nothing_and_hands_nothing_twice(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """A second instance joins while the first has records running and queued: the
    first deals with what it took for the partitions it gives up before it commits
    them, so the second starts past those."""
    topic = new_topic("async-rebalance", partitions=4)
    group = f"g-{uuid.uuid4().hex[:8]}"
    produced = records(800, keys=40)
    values = [r["value"] for r in produced]
    # Slow enough that the first is far from done when the second has joined.
    first, second = Watch(by_key, delay_s=(0.04, 0.08)), Watch(by_key)
    app_a, app_b = App(bootstrap, group=group, max_in_flight=8), App(bootstrap, group=group)
    app_a.add_handler(topic, first, strategy="service")
    app_b.add_handler(topic, second, strategy="service")
    with running_app(app_a):
        produce(bootstrap, topic, produced)
        assert wait_for(lambda: first.handled_count() >= 50, 60)
        with running_app(app_b):
            assert wait_for(lambda: first.handled_count() + second.handled_count() >= 800, 90)
            wait_for(lambda: first.handled_count() + second.handled_count() > 800, 1.5)
    assert second.handled_count() > 0, "the second instance took no partition"
    both = first.handled + second.handled
    twice = sorted({v for v in both if both.count(v) > 1})
    assert twice == [], f"handled twice: {twice[:10]} of {len(twice)}"
    assert sorted(both) == sorted(values)


def test_the_docs_example_charges_concurrently_and_dead_letters_the_empty_order(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("async-docs", partitions=2)
    source = docs_example(
        "## Async handlers",
        {
            '"localhost:9092"': repr(bootstrap),
            '"billing"': repr(f"g-{uuid.uuid4().hex[:8]}"),
            '"orders"': repr(topic),
        },
    )
    orders = [{"id": f"o-{i}", "total": float(i)} for i in range(100)]  # o-0: nothing to charge
    with running_example(source) as example:
        app: App = example["app"]
        produce(
            bootstrap,
            topic,
            [{"key": f"customer-{i % 7}", "value": json.dumps(o)} for i, o in enumerate(orders)],
        )
        assert wait_for(lambda: len(example["charged"]) == 99, 30), len(example["charged"])
        assert wait_for(lambda: outcome_count(app, topic, "dead_lettered") == 1, 30)
        # Counted at the end of the loop's turn, after the handlers ran.
        wait_for(lambda: outcome_count(app, topic, "handled") == 99, 30)
        assert outcome_count(app, topic, "handled") == 99
    assert example["charged"] == {o["id"]: o["total"] for o in orders[1:]}
    collector = Collector(bootstrap, f"{topic}.dlq")
    [letter] = collector.poll_until(1, 20)
    collector.close()
    assert json.loads(letter.value)["id"] == "o-0"


def test_an_async_handlers_time_counts_its_awaits(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """redrive_consumer_handler_seconds_total, for an ``async def`` handler, is each
    call's time from its start to its end: four calls that each await 0.25 s add at
    least a second, although they run at once."""
    topic = new_topic("async-time")

    async def slow(message: Message) -> None:
        await asyncio.sleep(0.25)

    app = App(bootstrap, group=f"g-async-time-{uuid.uuid4().hex[:8]}")
    app.add_handler(topic, slow, strategy="topics", policy=POLICY)
    with running_app(app):
        produce(bootstrap, topic, [{"key": f"k{i}".encode(), "value": b"v"} for i in range(4)])
        assert wait_for(lambda: outcome_count(app, topic, "handled") == 4, 30)
        seconds = app.metrics.registry.get_sample_value("redrive_consumer_handler_seconds_total")
    assert seconds is not None and seconds >= 1.0, seconds
