"""One poll of a share app: its records handled, settled and acknowledged.

Invariants:

- every record a poll returns is acknowledged before the next poll (explicit mode:
  the client refuses to poll otherwise), as :mod:`redrive.consumer.share.settle` says;
- the hand-offs of a poll's records are acknowledged by Kafka before those records'
  acknowledgements can leave (they go with the next poll, after :meth:`Turns.turn`
  flushed the producer): a consumer that dies in between loses nothing;
- a record is not started once its acquisition lock is about to run out
  (:attr:`GroupTerms.margin_s` before): it is released unhandled, and another consumer
  (or this one) takes it at once; an ``async def`` handler still running then is
  cancelled and its record released. A record at its last delivery before the
  group's limit is run whatever its lock: released, the broker would give up on it.
  A handler that ended after the lock ran out is counted and logged (its record may
  have been delivered to another consumer meanwhile: at least once);
- no record stops the loop: redrive's own failure on one is a dead letter built from
  the record (:meth:`Pipeline.unprocessable`), and the record is accepted.

Records of ``async def`` handlers of one poll run together on an event loop the app
owns, in its thread; the records of plain handlers run one after the other meanwhile.
A share group promises no order, so neither does this.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from confluent_kafka import AcknowledgeType, KafkaError, ShareConsumer
from confluent_kafka import Message as KafkaMessage

from redrive.consumer.handlers import refuse_awaitable
from redrive.consumer.message import Message
from redrive.consumer.pipeline import Pipeline
from redrive.consumer.publisher import Publisher
from redrive.consumer.routes import Kind
from redrive.consumer.share.group_terms import GroupTerms
from redrive.consumer.share.metrics import ShareMetrics
from redrive.consumer.share.settle import ACCEPT, RELEASE, Settler, last_delivery
from redrive.consumer.steps import Steps

log = structlog.get_logger("redrive.share")

ACK_NAMES = {ACCEPT: "accept", RELEASE: "release", AcknowledgeType.REJECT: "reject"}


@dataclass(slots=True)
class _Running:
    """A record of an async handler started in this poll."""

    record: KafkaMessage
    steps: Steps
    message: Message
    task: asyncio.Task[None]


class Turns:
    """The polls of one share app (see the module)."""

    def __init__(
        self,
        consumer: ShareConsumer,
        pipeline: Pipeline,
        settler: Settler,
        publisher: Publisher,
        metrics: ShareMetrics,
        terms: GroupTerms,
        poll_timeout_s: float,
        on_fatal: Callable[[KafkaError], Exception],
    ) -> None:
        self.consumer = consumer
        self.pipeline = pipeline
        self.settler = settler
        self.publisher = publisher
        self.metrics = metrics
        self.terms = terms
        self.poll_timeout_s = poll_timeout_s
        self.on_fatal = on_fatal
        asyncs = any(steps.route.is_async for steps, _ in pipeline.reads.values())
        self.loop = asyncio.new_event_loop() if asyncs else None
        self._handler_s = 0.0
        self._acks: dict[tuple[str, AcknowledgeType], int] = {}
        """Acknowledgements of this turn by route topic and type, counted once a turn:
        a labelled counter per record would cost more than redrive's own work."""

    def turn(self) -> bool:
        """Poll once and settle what came (see the module); always polls."""
        batch = self.consumer.poll(self.poll_timeout_s)
        if not batch:
            return True
        polled = time.monotonic()
        start_by = polled + self.terms.lock_ms / 1000 - self.terms.margin_s
        running: list[_Running] = []
        # Timed per poll, as the App times a batch: two clock reads per record would
        # cost more than redrive's own work (async calls are timed one by one).
        started = time.perf_counter()
        for record in batch:
            error = record.error()
            if error is not None:
                if error.code() == KafkaError._FATAL:
                    raise self.on_fatal(error)
                log.warning("consume error", error=error.str())
                continue
            steps, kind = self.pipeline.reads[record.topic() or ""]
            ack = self._start(record, steps, kind, polled, start_by, running)
            if ack is not None:
                self._acknowledge(record, steps, ack)
        self._handler_s += time.perf_counter() - started
        if running:
            assert self.loop is not None
            self.loop.run_until_complete(self._settle(running, polled, start_by))
        self.metrics.handler_seconds.inc(self._handler_s)
        self._handler_s = 0.0
        for (topic, ack), count in self._acks.items():
            self.metrics.acknowledgements.labels(topic, ACK_NAMES[ack]).inc(count)
        self._acks.clear()
        if self.publisher.in_flight:
            self.publisher.flush()  # before the acknowledgements leave, with the next poll
        for topic, count in self.pipeline.handled.items():
            self.metrics.records.labels(topic, "handled").inc(count)
        self.pipeline.handled.clear()
        return True

    def close(self) -> None:
        if self.loop is not None:
            self.loop.close()

    # ------------------------------------------------------------------ one record

    def _start(
        self,
        record: KafkaMessage,
        steps: Steps,
        kind: Kind,
        polled: float,
        start_by: float,
        running: list[_Running],
    ) -> AcknowledgeType | None:
        """Handle a record of a plain handler (its acknowledgement), or start one of an
        async handler (None: settled once it ends)."""
        topic, partition, offset = record.topic(), record.partition(), record.offset()
        if topic is None or partition is None or offset is None:
            return None  # only error events lack coordinates
        count = record.delivery_count() or 1
        if time.monotonic() > start_by and count < self.terms.delivery_limit:
            self._lock_released(steps, record, "not started: its acquisition lock runs out")
            return RELEASE
        try:
            prepared = self.pipeline.prepare(steps, kind, record, topic, partition, offset)
            if not isinstance(prepared, Message):
                return ACCEPT  # dealt with before its handler: a repeat, a dead letter
            message = prepared
            message.attempt += count - 1  # each delivery of this copy is an attempt
            message.delivery_count = count
            route = steps.route
            if route.is_async:
                task = self._loop().create_task(self._timed(route.handler, message))
                running.append(_Running(record, steps, message, task))
                return None
            try:
                result = route.handler(message)
                if result is not None and inspect.isawaitable(result):
                    raise refuse_awaitable(result)  # an async function behind a plain one
            except Exception as exc:  # noqa: BLE001 - the handler's failure is what we handle
                ack = self.settler.failed(route, message, exc)
            else:
                self.pipeline.outcomes.succeeded(steps, message, None)
                ack = ACCEPT
            if time.monotonic() - polled > self.terms.lock_ms / 1000:
                self._outlived(steps, message)
            return ack
        except Exception as exc:  # noqa: BLE001 - redrive's own failure: no record stops us
            self.pipeline.unprocessable(record, topic, partition, offset, exc)
            return ACCEPT

    async def _timed(self, handler: Callable[[Message], Awaitable[Any]], message: Message) -> None:
        started = time.perf_counter()
        try:
            await handler(message)
        finally:
            self._handler_s += time.perf_counter() - started

    async def _settle(self, running: list[_Running], polled: float, start_by: float) -> None:
        """Let the async handlers run until the lock's margin; cancel those still
        running (but records at their last delivery), then settle each record."""
        tasks = {item.task for item in running}
        _, late = await asyncio.wait(tasks, timeout=max(start_by - time.monotonic(), 0))
        keep = {
            item.task
            for item in running
            if item.task in late and last_delivery(item.message, self.terms.delivery_limit)
        }
        for task in late - keep:
            task.cancel()
        if late:
            await asyncio.wait(late)
        for item in running:
            self._acknowledge(item.record, item.steps, self._outcome(item, polled))

    def _outcome(self, item: _Running, polled: float) -> AcknowledgeType:
        steps, message, task = item.steps, item.message, item.task
        if task.cancelled():
            self._lock_released(steps, item.record, "handler cancelled: its lock runs out")
            return RELEASE
        try:
            error = task.exception()
            if error is None:
                self.pipeline.outcomes.succeeded(steps, message, None)
                ack = ACCEPT
            elif isinstance(error, Exception):
                ack = self.settler.failed(steps.route, message, error)
            else:
                raise error  # KeyboardInterrupt, SystemExit: not the record's
            if time.monotonic() - polled > self.terms.lock_ms / 1000:
                self._outlived(steps, message)
            return ack
        except Exception as exc:  # noqa: BLE001 - redrive's own failure: no record stops us
            self.pipeline.unprocessable(
                item.record, message.topic, message.partition, message.offset, exc
            )
            return ACCEPT

    # ------------------------------------------------------------------ bookkeeping

    def _loop(self) -> asyncio.AbstractEventLoop:
        assert self.loop is not None  # made when a route is async
        return self.loop

    def _acknowledge(self, record: KafkaMessage, steps: Steps, ack: AcknowledgeType) -> None:
        self.consumer.acknowledge(record, ack)
        counted = (steps.route.topic, ack)
        self._acks[counted] = self._acks.get(counted, 0) + 1

    def _lock_released(self, steps: Steps, record: KafkaMessage, why: str) -> None:
        self.metrics.lock_released.labels(steps.route.topic).inc()
        log.warning(
            "record released unhandled: " + why,
            topic=record.topic(),
            partition=record.partition(),
            offset=record.offset(),
            delivery_count=record.delivery_count(),
            lock_ms=self.terms.lock_ms,
        )

    def _outlived(self, steps: Steps, message: Message) -> None:
        self.metrics.lock_outlived.labels(steps.route.topic).inc()
        log.warning(
            "handler outlived its record's acquisition lock; the record may have been "
            "delivered to another consumer too",
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            lock_ms=self.terms.lock_ms,
        )
