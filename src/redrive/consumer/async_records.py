"""Records of ``async def`` handlers: run on an event loop the App owns, many at once.

The App's loop stays one thread: it polls Kafka, hands each record of an async route
to its *lane* here, and then runs the event loop for a slice of time
(:meth:`AsyncRecords.run`), during which the handlers progress, and their outcomes
(counted, retried, dead-lettered, a partition sought back) are carried out by the
same steps as for plain handlers (:mod:`redrive.consumer.pipeline`). One
thread means no locks, and nothing of redrive's runs while the loop is in
``consume``.

Invariants:

- **order**: a lane runs one record at a time, in the order the records arrived. A
  route whose strategy retries in place (``blocking``, ``pause``) has one lane per
  partition, so its order is kept as with a plain handler; the others one per message
  key (per route, across its source and retry topics): a key's next record does not
  start before the previous one ended. Records without a key promise no order and
  each runs at once;
- **bound**: at most ``max_in_flight`` records are accepted and not dealt with
  (running, or queued in a lane); the loop fetches no more than there is room for;
- **offsets**: a partition's position moves only past records dealt with
  (:class:`redrive.consumer.in_flight.InFlight`), however they end out of order, and
  a partition has one from its first record read on (its committed offset, or that
  record's), so that a commit always names, with the partition's offsets, the
  records of it done beyond the position, whose hand-offs it commits
  (:mod:`redrive.consumer.offsets`);
- **waits**: a failure retried in place seeks its partition back to the record and
  pauses it (as for a plain handler); the records queued behind it in its lane are
  dropped, to be fetched again after it. A circuit breaker that opens also drops what
  is queued in every per-partition lane, seeking each partition back. A route kept
  in key order waits only at :meth:`AsyncRecords.accept` (its dead-letter brake,
  ``Steps.intake_brake``; a tier record not due): the record is not taken, and its
  partition waits from it; what its brake finds taken at its turn waits in its
  lane (asleep, in flight) until the brake lets it pass;
- **leaving**: on a revoke and on stop, the records taken for the partitions leaving,
  running or queued, get :data:`DRAIN_TIMEOUT_S` to be dealt with, then the
  positions are committed. Finishing what was taken, rather than dropping what has
  not started, is what keeps the next owner from handling records again: a key's
  later records may have ended while an earlier one of another key waited, and a
  committed offset cannot say so. What a timeout leaves is handled again by the
  next owner (at least once).

A failure of redrive's own while carrying out an outcome is a dead letter built from
the record (:meth:`Pipeline.unprocessable`); should even that fail, the error stops the
App from :meth:`AsyncRecords.run`, uncommitted, as for a plain handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import structlog
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka import Message as KafkaMessage

from redrive.clock import now_ms
from redrive.consumer.brake import BreakerState
from redrive.consumer.in_flight import InFlight
from redrive.consumer.message import Message
from redrive.consumer.offsets import OffsetTracker, Partition
from redrive.consumer.outcomes import InPlace
from redrive.consumer.pauses import PauseBook
from redrive.consumer.pipeline import Pipeline
from redrive.consumer.routes import Kind
from redrive.consumer.steps import Steps
from redrive.consumer.strategies import Wait
from redrive.errors import ConfigError

log = structlog.get_logger("redrive.consumer")

DEFAULT_MAX_IN_FLIGHT = 100
"""Records of async handlers accepted and not dealt with, at most, by default: as many
as httpx's default connection pool serves at once."""


def checked_bound(max_in_flight: object) -> int:
    """``App(max_in_flight=...)`` as given, or a ConfigError naming it."""
    if type(max_in_flight) is not int or max_in_flight < 1:
        raise ConfigError(
            "App(max_in_flight=...)",
            f"{max_in_flight!r} is not a whole number >= 1",
            f"use the default {DEFAULT_MAX_IN_FLIGHT}, or how many records your "
            "handlers may work on at once",
        )
    return max_in_flight


TURN_S = 0.01
"""How long the event loop runs per turn of the App's loop while records are in
flight and there is room for more: the longest a new record waits to be fetched while
handlers await."""
DRAIN_TIMEOUT_S = 10.0
"""How long running records get to end when their partitions leave (a revoke, a
stop) before the positions are committed without them."""

LaneKey = tuple[str, int] | tuple[str, bytes]
"""(topic, partition) for routes kept in partition order, (route topic, key) else."""


@dataclass(slots=True)
class _Item:
    """A record taken into a lane; ``message`` is None until it is read (a route kept
    in partition order reads each record at its turn)."""

    steps: Steps
    kind: Kind
    record: KafkaMessage
    topic: str
    partition: int
    offset: int
    message: Message | None
    probe: bool = False
    """Admitted by its route's half-open brake as it was taken: the probe."""


class AsyncRecords:
    """The App's async routes in a running App (see the module)."""

    @classmethod
    def of(
        cls,
        records: Pipeline,
        offsets: OffsetTracker,
        pauses: PauseBook,
        consumer: Consumer,
        max_in_flight: int,
    ) -> AsyncRecords | None:
        """For the topics whose handler is ``async def`` (None: there is none)."""
        topics = frozenset(t for t, (steps, _) in records.reads.items() if steps.route.is_async)
        if not topics:
            return None
        return cls(records, offsets, pauses, consumer, topics, max_in_flight)

    def __init__(
        self,
        records: Pipeline,
        offsets: OffsetTracker,
        pauses: PauseBook,
        consumer: Consumer,
        topics: frozenset[str],
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        self.records = records
        self.offsets = offsets
        self.pauses = pauses
        self.consumer = consumer
        self.topics = topics
        """The topics read for async routes (sources, tiers, per-group topics)."""
        self.max_in_flight = max_in_flight
        self.in_flight = InFlight()
        self.loop = asyncio.new_event_loop()
        self._lanes: dict[LaneKey, deque[_Item]] = {}
        """Lanes with a record running: the records queued behind it."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._wake_below = 1
        self._fatal: BaseException | None = None
        self._handler_s = 0.0
        """Handler time since the last turn, each call from its start to its end, awaits
        included (what a record waits for its handler; calls at once overlap). Added
        to the metric once a turn, not once a call: the hot path stays two clock reads."""
        self.done_before = records.done_before
        """Records beyond a partition's committed position its commit named as dealt
        with, skipped when read again (resumed and forgotten by the assignment)."""
        offsets.done_beyond = self.in_flight.done_beyond

    # ------------------------------------------------------------------ the App's loop

    def room(self) -> int:
        """How many more records may be accepted now."""
        return max(self.max_in_flight - self.in_flight.count, 0)

    def forget(self, partitions: set[Partition]) -> None:
        """Partitions revoked: their records are no longer this App's."""
        self.in_flight.forget(partitions)

    def accept(self, record: KafkaMessage, topic: str, partition: int, offset: int) -> Wait | None:
        """Take a record of an async route into its lane. None once it is taken (or
        already dealt with: a dead letter before its handler, or named so by the last
        commit); a Wait for a tier record not due yet, which the loop makes its
        partition wait for, unaccepted."""
        steps, kind = self.records.reads[topic]
        route = steps.route
        tp = (topic, partition)
        # A position from its first record read: a commit while it runs names the
        # records done after it (their hand-offs are in the transaction) with it.
        self.offsets.reached(tp, offset)
        if self.done_before.by_partition and self.done_before.skip(tp, offset):
            # Dealt with before a crash or an aborted transaction's rewind, its hand-off
            # committed with the position: not again.
            self.in_flight.accept(tp, offset)
            self._done(tp, offset)
            self.records.skipped(topic, partition, offset)
            return None
        message: Message | None = None
        probe = False
        lane: LaneKey | None
        if route.strategy.in_place:
            # Read when its turn comes: a record before it may yet seek the partition
            # back, and then this one is fetched again, not dead-lettered twice.
            lane = tp
        else:
            prepared = self._prepare(steps, kind, record, topic, partition, offset)
            if isinstance(prepared, Wait):
                return prepared
            if prepared is None:  # dealt with: a dead letter before its handler
                self.in_flight.accept(tp, offset)
                self._done(tp, offset)
                return None
            message = prepared
            brake = steps.intake_brake
            if brake is not None and brake.state:  # held now, in partition order
                held = brake.admit(message)
                if held is not None:
                    return held  # untaken: its partition waits from it
                probe = brake.state is BreakerState.HALF_OPEN
            lane = None if message.key is None else (route.topic, message.key)
        self.in_flight.accept(tp, offset)
        item = _Item(steps, kind, record, topic, partition, offset, message, probe)
        if lane is not None:
            queued = self._lanes.get(lane)
            if queued is not None:
                queued.append(item)
                return None
            self._lanes[lane] = deque()
        self._start(self._lane(lane, item))
        return None

    def _prepare(
        self,
        steps: Steps,
        kind: Kind,
        record: KafkaMessage,
        topic: str,
        partition: int,
        offset: int,
    ) -> Message | Wait | None:
        """:meth:`Pipeline.prepare`, a failure of redrive's own there being a dead letter."""
        records = self.records
        try:
            return records.prepare(steps, kind, record, topic, partition, offset)
        except Exception as exc:  # noqa: BLE001 - no record may stop the consumer
            records.unprocessable(record, topic, partition, offset, exc)
            return None

    def run(self, timeout_s: float) -> None:
        """Run the event loop: the records taken since the last turn start, and every
        record runs until it awaits or ends; then, while records are in flight, up to
        ``timeout_s`` more, until there is room again when there was none, or nothing
        is left in flight."""
        if not self._tasks:
            return
        saturated = self.room() == 0
        self.loop.run_until_complete(self._slice(timeout_s, saturated))
        self._count_handler_time()
        if self._fatal is not None:
            raise self._fatal

    def drain(self, partitions: set[Partition] | None, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """``partitions`` (None: all) leave: the records taken for them, running or
        queued, get up to ``timeout_s`` to be dealt with; what is left after that is
        given up (see the module)."""

        def leaving(tp: Partition) -> bool:
            return partitions is None or tp in partitions

        deadline = time.monotonic() + timeout_s

        async def settled() -> None:
            while self.in_flight.open_in(leaving) and time.monotonic() < deadline:
                await asyncio.sleep(0.005)

        if self._tasks:
            self.loop.run_until_complete(settled())
            self._count_handler_time()
        for queued in self._lanes.values():
            kept = [item for item in queued if not leaving(_partition(item))]
            for item in queued:
                if leaving(_partition(item)):
                    self.in_flight.give_up(_partition(item), item.offset)
            queued.clear()
            queued.extend(kept)
        left = sorted(f"{t}[{p}]" for t, p in self.in_flight.open_in(leaving))
        if left:
            log.warning(
                "records of async handlers not dealt with by the drain timeout; the "
                "next owner of their partitions handles them again",
                partitions=left,
                timeout_s=timeout_s,
            )
        if self._fatal is not None:
            raise self._fatal

    def close(self) -> None:
        """Cancel what still runs and close the event loop (the App has stopped)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        with contextlib.suppress(Exception):
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    # ------------------------------------------------------------------ lanes

    def _count_handler_time(self) -> None:
        if self._handler_s:
            self.records.outcomes.metrics.handler_seconds.inc(self._handler_s)
            self._handler_s = 0.0

    def _start(self, coroutine: Coroutine[Any, Any, None]) -> None:
        # Kept until the lane ends (it discards itself: cheaper than a done callback),
        # so that a task waiting on what nothing else holds is not collected.
        self._tasks.add(self.loop.create_task(coroutine))

    async def _slice(self, timeout_s: float, saturated: bool) -> None:
        await asyncio.sleep(0)  # every started record's first step
        if timeout_s <= 0 or not self.in_flight.count:
            return
        self._wake.clear()
        self._wake_below = self.max_in_flight if saturated else 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout_s)

    async def _lane(self, lane: LaneKey | None, item: _Item) -> None:
        """Run a lane's records one after the other until it is empty, or its
        partition is sought back."""
        records, outcomes = self.records, self.records.outcomes
        current: _Item | None = item
        try:
            while current is not None:
                message, steps = current.message, current.steps
                if (
                    message is not None
                    and not steps.gates
                    and not records.in_place
                    and steps.intake_brake is None
                ):
                    # The usual record, inline (the success path is the hot path): read
                    # already, and no gate or retry in place to consult.
                    started = time.perf_counter()
                    try:
                        await steps.route.handler(message)
                    except Exception as exc:  # noqa: BLE001 - what _one handles
                        self._handler_s += time.perf_counter() - started
                        go_on = self._failed(current, message, exc)
                    else:
                        self._handler_s += time.perf_counter() - started
                        outcomes.succeeded(steps, message, None)
                        self._done((current.topic, current.partition), current.offset)
                        go_on = True
                else:
                    go_on = await self._one(current)
                queued = self._lanes.get(lane) if lane is not None else None
                if not go_on and queued is not None:
                    queued.clear()  # dropped by the wait, fetched again after it
                current = queued.popleft() if queued else None
            if lane is not None:
                del self._lanes[lane]
        finally:
            task = asyncio.current_task()
            if task is not None:
                self._tasks.discard(task)

    async def _one(self, item: _Item) -> bool:
        """Run one record's handler and carry out its outcome; whether its lane goes on
        (False: its partition was sought back to it)."""
        steps, records = item.steps, self.records
        tp, offset = (item.topic, item.partition), item.offset
        try:
            message = item.message
            if message is None:
                prepared = self._prepare(steps, item.kind, item.record, *tp, offset)
                if isinstance(prepared, Wait):  # not from a source topic: not reached
                    self._wait(tp, offset, prepared)
                    return False
                if prepared is None:  # a dead letter before its handler
                    self._done(tp, offset)
                    return True
                message = prepared
            # Its key may have become held while it waited in its lane (an earlier
            # record of the key failed): then it goes behind, unstarted. An open
            # breaker keeps it waiting, unstarted.
            stop = records.gate(steps, message)
            if isinstance(stop, Wait):
                self._wait(tp, offset, stop)
                return False
            if stop is not None:
                self._done(tp, offset)
                return True
            brake = steps.intake_brake
            if brake is not None and not item.probe:
                # Taken before its brake opened: it waits here, taken, its handler unrun.
                while brake.state and (held := brake.admit(message)) is not None:
                    await asyncio.sleep(max(held.until_ms - now_ms(), 10) / 1000)
                    if not self.in_flight.holds(tp, offset):
                        return True  # given up or its partition left: not ours to handle
            state = records.state_of(item.topic, item.partition, offset)
        except Exception as exc:  # noqa: BLE001 - redrive's own failure on this record
            return self._unprocessable(item, exc)
        started = time.perf_counter()
        try:
            await steps.route.handler(message)
        except Exception as exc:  # noqa: BLE001 - the handler's failure is what we handle
            self._handler_s += time.perf_counter() - started
            return self._failed(item, message, exc, state)
        self._handler_s += time.perf_counter() - started
        try:
            records.outcomes.succeeded(steps, message, state)
        except Exception as exc:  # noqa: BLE001 - redrive's own failure on this record
            return self._unprocessable(item, exc)
        self._done(tp, offset)
        return True

    def _failed(
        self, item: _Item, message: Message, error: Exception, state: InPlace | None = None
    ) -> bool:
        """The handler raised: route the failure and carry it out; whether the lane
        goes on (False: the record's partition was sought back to it)."""
        tp = (item.topic, item.partition)
        try:
            wait = self.records.outcomes.failed(item.steps, message, error, state)
            if wait is not None:
                self._wait(tp, item.offset, wait)
                return False
        except Exception as exc:  # noqa: BLE001 - redrive's own failure on this record
            return self._unprocessable(item, exc)
        self._done(tp, item.offset)
        return True

    def _unprocessable(self, item: _Item, cause: Exception) -> bool:
        """redrive failed on the record: a dead letter built from it; should even that be
        refused, the App stops (from :meth:`run`), uncommitted."""
        try:
            self.records.unprocessable(item.record, item.topic, item.partition, item.offset, cause)
        except BaseException as fatal:  # noqa: BLE001 - the dead letter itself was refused: stop
            self._fatal = fatal
            return False
        self._done((item.topic, item.partition), item.offset)
        return True

    def _done(self, tp: Partition, offset: int) -> None:
        position = self.in_flight.done(tp, offset)
        if position is not None:
            self.offsets.mark(tp, position)
        if self.in_flight.count < self._wake_below:
            self._wake.set()

    def _wait(self, tp: Partition, offset: int, wait: Wait) -> None:
        """The record at ``offset`` waits (its retry in place, or a breaker): its
        partition is sought back to it (past it when it is dealt with already), and
        with ``all_partitions`` every per-partition lane drops what is queued. Only
        routes kept in partition order wait, so what follows the record in its
        partition is queued in its own lane, never running."""
        if wait.dealt_with:
            self._done(tp, offset)
            offset += 1
        self.in_flight.drop_from(tp, offset)
        self.pauses.wait(tp, offset, wait.until_ms)
        if wait.all_partitions:
            for lane, queued in self._lanes.items():
                if queued and lane != tp and queued[0].steps.route.strategy.in_place:
                    first = queued[0]
                    queued.clear()
                    self.in_flight.drop_from(_partition(first), first.offset)
                    self.consumer.seek(TopicPartition(first.topic, first.partition, first.offset))
            all_until = wait.all_until_ms
            self.pauses.pause_all(wait.until_ms if all_until is None else all_until)
        if self.in_flight.count < self._wake_below:
            self._wake.set()


def _partition(item: _Item) -> Partition:
    return (item.topic, item.partition)
