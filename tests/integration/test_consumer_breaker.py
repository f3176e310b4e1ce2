"""The pause strategy's circuit breaker against the real broker: it opens after its
failures, no partition delivers while it is open, one record probes it half-open, a
failed probe reopens it for longer, a successful one closes it and every partition
flows again; the metric and the on_breaker hook show each state."""

from __future__ import annotations

import asyncio
import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from redrive import App, Breaker, Message, Pause
from redrive.clock import now_ms
from redrive.consumer.breaker import BreakerState
from redrive.deadlines import Deadline
from tests.integration.consumer_harness import running_app
from tests.integration.service_harness import produce

pytestmark = pytest.mark.integration

CLOCK_SLACK_MS = 5
"""The on_breaker hook stamps a transition when it is called, a few ms after the
breaker read the clock that set its open time."""

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN
STATE = "redrive_consumer_breaker_state"


class DatabaseDown(Exception):
    pass


@dataclass(frozen=True)
class Call:
    partition: int
    value: bytes
    at_ms: int
    ok: bool


@dataclass(frozen=True)
class Change:
    old: BreakerState
    new: BreakerState
    at_ms: int
    metric: float | None
    """The gauge in the App's registry when the hook ran."""


class Story:
    """What the App did, in order: handler calls and breaker transitions. Both are
    appended by the App's loop thread, so their order is the order they happened in."""

    def __init__(self) -> None:
        self.events: list[Call | Change] = []
        self.lock = threading.Lock()

    def add(self, event: Call | Change) -> None:
        with self.lock:
            self.events.append(event)

    def snapshot(self) -> list[Call | Change]:
        with self.lock:
            return list(self.events)

    def changes(self) -> list[Change]:
        return [e for e in self.snapshot() if isinstance(e, Change)]

    def calls_between(self, first: Change, then: Change | None) -> list[Call]:
        events = self.snapshot()
        start = events.index(first)
        end = events.index(then) if then is not None else len(events)
        return [e for e in events[start + 1 : end] if isinstance(e, Call)]


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = Deadline(timeout_s)
    while not deadline.passed():
        if predicate():
            return
        time.sleep(0.02)
    assert predicate(), f"timed out waiting for {what}"


def comes(predicate: Callable[[], bool], within_s: float) -> bool:
    """Whether ``predicate`` becomes true within ``within_s`` (for what must not come)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def scraped_state(app: App, topic: str) -> float | None:
    """The breaker's state as Prometheus sees it: GET /metrics."""
    assert app.metrics_url is not None
    with urllib.request.urlopen(app.metrics_url, timeout=10) as response:
        text = response.read().decode()
    match = re.search(rf'^{STATE}{{topic="{re.escape(topic)}"}} (\S+)$', text, re.MULTILINE)
    return None if match is None else float(match.group(1))


class Downstream:
    """A handler whose database is down while ``failing`` is set; its calls and the
    breaker's changes are told in ``story``."""

    def __init__(self) -> None:
        self.story = Story()
        self.failing = threading.Event()
        self.failing.set()

    def on_breaker(self, name: str, old: BreakerState, new: BreakerState) -> None:
        self.story.add(Change(old, new, now_ms(), None))

    def handler(self, message: Message) -> None:
        ok = not self.failing.is_set()
        self.story.add(Call(message.partition, message.raw_value or b"", now_ms(), ok))
        if not ok:
            raise DatabaseDown("the database is down")


@pytest.mark.parametrize("kind", ["def", "async def"])
def test_the_breaker_opens_pauses_every_partition_probes_once_and_closes(
    kind: str, bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("breaker", partitions=4)
    story = Story()
    failing = threading.Event()
    failing.set()
    hold_next = threading.Event()  # the next call blocks until `release` (the probe)
    probing = threading.Event()
    release = threading.Event()

    def on_breaker(name: str, old: BreakerState, new: BreakerState) -> None:
        assert name == topic
        metric = app.metrics.registry.get_sample_value(STATE, {"topic": topic})
        story.add(Change(old, new, now_ms(), metric))

    def begin(message: Message) -> tuple[bool, bool]:
        """Whether the database is up, and whether this call is the held probe."""
        ok = not failing.is_set()
        story.add(Call(message.partition, message.raw_value or b"", now_ms(), ok))
        held = hold_next.is_set()
        if held:
            hold_next.clear()
            probing.set()
        return ok, held

    def plain(message: Message) -> None:
        ok, held = begin(message)
        if held:
            assert release.wait(30)
        if not ok:
            raise DatabaseDown("the database is down")

    async def awaiting(message: Message) -> None:
        # The same, the App's loop running its other records while the probe waits.
        ok, held = begin(message)
        for _ in range(3000 if held else 0):
            if release.is_set():
                break
            await asyncio.sleep(0.01)
        if not ok:
            raise DatabaseDown("the database is down")

    handler = plain if kind == "def" else awaiting

    app = App(bootstrap, group=f"g-{uuid.uuid4().hex[:8]}", metrics_port=0, on_breaker=on_breaker)
    app.add_handler(
        topic,
        handler,
        strategy=Pause(
            breaker=Breaker(failures=5, window="30s", open_for="exponential 2s x2 max 8s")
        ),
        policy="1s x*",
        max_attempts=1000,
    )
    with running_app(app):
        assert app.metrics.registry.get_sample_value(STATE, {"topic": topic}) == 0
        produce(bootstrap, topic, [{"value": f"a{p}".encode(), "partition": p} for p in range(4)])

        # Five failures in a row (four first deliveries, then a retry) open it.
        wait_for(lambda: len(story.changes()) >= 1, 30, "the breaker to open")
        opened = story.changes()[0]
        assert (opened.old, opened.new, opened.metric) == (CLOSED, OPEN, 1)
        events = story.snapshot()
        before = events[: events.index(opened)]
        assert all(isinstance(e, Call) and not e.ok for e in before)
        assert len(before) == 5
        assert {e.partition for e in before if isinstance(e, Call)} == {0, 1, 2, 3}
        assert scraped_state(app, topic) == 1

        # While it is open, records come on all four partitions: none is handled.
        produce(bootstrap, topic, [{"value": f"b{p}".encode(), "partition": p} for p in range(4)])
        produced_at = now_ms()
        wait_for(lambda: len(story.changes()) >= 2, 30, "half-open")
        half = story.changes()[1]
        assert (half.old, half.new, half.metric) == (OPEN, HALF_OPEN, 2)
        assert produced_at < half.at_ms, "the records came after the breaker was open"
        assert story.calls_between(opened, half) == []
        # The hook reads the clock a little after the breaker did (CLOCK_SLACK_MS).
        assert half.at_ms - opened.at_ms >= 2000 - CLOCK_SLACK_MS

        # Half-open: exactly one record passes; it fails, and the breaker reopens for
        # the next, longer time (4 s).
        wait_for(lambda: len(story.changes()) >= 3, 30, "the probe's failure")
        reopened = story.changes()[2]
        assert (reopened.old, reopened.new, reopened.metric) == (HALF_OPEN, OPEN, 1)
        [probe] = story.calls_between(half, reopened)
        assert not probe.ok

        # The database is back; the next probe is held while /metrics shows half-open.
        failing.clear()
        hold_next.set()
        assert scraped_state(app, topic) == 1
        wait_for(probing.is_set, 30, "the second probe")
        second_half = story.changes()[3]
        assert (second_half.old, second_half.new, second_half.metric) == (OPEN, HALF_OPEN, 2)
        assert second_half.at_ms - reopened.at_ms >= 4000 - CLOCK_SLACK_MS
        assert (second_half.at_ms - reopened.at_ms) > (half.at_ms - opened.at_ms)
        assert story.calls_between(reopened, second_half) == []
        assert scraped_state(app, topic) == 2
        assert len(story.calls_between(second_half, None)) == 1  # only the probe
        release.set()

        # It succeeds: closed, and every partition flows again.
        wait_for(lambda: len(story.changes()) >= 5, 30, "closed")
        closed = story.changes()[4]
        assert (closed.old, closed.new, closed.metric) == (HALF_OPEN, CLOSED, 0)
        values = {f"{x}{p}".encode() for x in "ab" for p in range(4)}

        def all_handled() -> bool:
            done = {e.value for e in story.snapshot() if isinstance(e, Call) and e.ok}
            return done >= values

        wait_for(all_handled, 30, "every record to be handled")
        after = story.calls_between(second_half, None)
        assert {c.partition for c in after} == {0, 1, 2, 3}
        assert all(c.ok for c in after)
        assert scraped_state(app, topic) == 0
        assert len(story.changes()) == 5


def test_partitions_a_rebalance_assigns_while_open_wait_too(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """Two instances share the topic; the first's breaker opens; the second leaves, and
    its partitions, assigned to the first while its breaker is open, deliver nothing
    until the breaker is half-open."""
    topic = new_topic("breaker-rebalance", partitions=4)
    group = f"g-{uuid.uuid4().hex[:8]}"
    down = Downstream()
    story, failing, on_breaker, handler = down.story, down.failing, down.on_breaker, down.handler

    def fine(message: Message) -> None:
        pass

    first = App(bootstrap, group=group, on_breaker=on_breaker)
    first.add_handler(
        topic,
        handler,
        strategy=Pause(breaker=Breaker(failures=3, window="30s", open_for="15s")),
        policy="500ms x*",
        max_attempts=1000,
    )
    second = App(bootstrap, group=group)
    second.add_handler(topic, fine, strategy="pause")

    def assigned(app: App) -> int:
        return int(str(app.health().detail["assigned_partitions"]))

    with running_app(first):
        with running_app(second):
            wait_for(lambda: assigned(first) == 2 and assigned(second) == 2, 60, "a split")
            produce(
                bootstrap, topic, [{"value": f"a{p}".encode(), "partition": p} for p in range(4)]
            )
            wait_for(lambda: len(story.changes()) >= 1, 30, "the breaker to open")
        opened = story.changes()[0]
        assert opened.new is OPEN
        wait_for(lambda: assigned(first) == 4, 30, "the second's partitions")
        assert len(story.changes()) == 1, "still open"
        produce(bootstrap, topic, [{"value": f"b{p}".encode(), "partition": p} for p in range(4)])
        produced_at = now_ms()
        failing.clear()  # the probe will succeed
        wait_for(lambda: len(story.changes()) >= 3, 40, "half-open, then closed")
        half, closed = story.changes()[1:3]
        assert (half.new, closed.new) == (HALF_OPEN, CLOSED)
        assert produced_at < half.at_ms, "the records came while the breaker was open"
        assert story.calls_between(opened, half) == []
        values = {f"b{p}".encode() for p in range(4)}

        def all_handled() -> bool:
            return {e.value for e in story.snapshot() if isinstance(e, Call) and e.ok} >= values

        wait_for(all_handled, 30, "every record to be handled")
        handled_after = {c.partition for c in story.calls_between(half, None)}
        assert handled_after == {0, 1, 2, 3}  # the second's former partitions too


def test_dead_letters_of_spent_policies_open_it_and_are_not_handled_again(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """No retries (max_attempts=1): each failure is a dead letter at once. Three open
    the breaker; the records after them wait; none is handled twice."""
    topic = new_topic("breaker-dlq", partitions=2)
    down = Downstream()
    story, failing, on_breaker, handler = down.story, down.failing, down.on_breaker, down.handler

    app = App(bootstrap, group=f"g-{uuid.uuid4().hex[:8]}", on_breaker=on_breaker)
    app.add_handler(
        topic,
        handler,
        strategy=Pause(breaker=Breaker(failures=3, window="30s", open_for="3s")),
        policy="1s",
        max_attempts=1,
    )
    values = [f"r{i}".encode() for i in range(10)]
    with running_app(app):
        produce(bootstrap, topic, [{"value": v, "partition": i % 2} for i, v in enumerate(values)])
        wait_for(lambda: len(story.changes()) >= 1, 30, "the breaker to open")
        opened = story.changes()[0]
        assert opened.new is OPEN
        events = story.snapshot()
        assert len([e for e in events[: events.index(opened)] if isinstance(e, Call)]) == 3
        failing.clear()
        wait_for(lambda: len(story.changes()) >= 3, 30, "half-open, then closed")
        half = story.changes()[1]
        assert story.calls_between(opened, half) == []

        def handled() -> list[bytes]:
            return [e.value for e in story.snapshot() if isinstance(e, Call)]

        wait_for(lambda: len(handled()) >= len(values), 30, "every record")
        assert not comes(lambda: len(handled()) > len(values), 1.5), "handled twice"
    assert sorted(handled()) == sorted(values)  # each once: dead letters are done
