"""One record's way through the App: handled, or its failure routed and carried out.

Invariant: :meth:`Records.process` deals with every record it is given. It returns
None once the record is dealt with (handled; its retry handed to Kafka; or
dead-lettered), or a :class:`Wait` for a record to handle again at the same offset
later (a retry in place, a tier record not due yet). What a failure becomes is the
failure router's decision (``route.router``, :mod:`redrive.router`); where the retry
goes and how it waits, the strategy's (``route.strategy``).

No record stops the loop: a record whose headers cannot be read, or whose value does
not deserialize, is a dead letter with its raw key and value; any other exception of
redrive's own on a record is turned into one by :meth:`Records.unprocessable`. Only
a hand-off the producer refuses for good stops the App, uncommitted (nothing is lost).

The success path is the hot path: per record only the header read, the handler call
and a few dict operations; counts are kept per batch (:attr:`Records.handled`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from confluent_kafka import Message as KafkaMessage

from redrive.consumer.errors import (
    DeserializationError,
    UnprocessableRecordError,
    UnreadableHeadersError,
)
from redrive.consumer.handlers import refuse_awaitable
from redrive.consumer.held_keys import HeldKeys
from redrive.consumer.key_lines import KeyLines
from redrive.consumer.key_order import KeyOrder
from redrive.consumer.message import Message
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.offsets import Partition
from redrive.consumer.publisher import Publisher
from redrive.consumer.repeats import RecentIds
from redrive.consumer.routes import Kind, Route
from redrive.consumer.strategies import Wait
from redrive.consumer.strategies.pause import Breakers
from redrive.headers import (
    Header,
    RetryHeaders,
    is_redrive_header,
)
from redrive.kafka import message_time, read_headers
from redrive.policy import DeadLetter, Retry
from redrive.router import DeadLettered, FailedRecord, Retried, read_delivery

log = structlog.get_logger("redrive.consumer")

RetryHook = Callable[[Message, Retry, BaseException], None]
DeadLetterHook = Callable[[Message | None, DeadLetter, BaseException], None]


@dataclass(frozen=True, slots=True)
class InPlace:
    """A record being retried in place (blocking, pause): its failures so far."""

    offset: int
    failures: int
    first_failure_ms: int


class Records:
    """Processes the records of one App (see the module)."""

    def __init__(
        self,
        group: str,
        reads: dict[str, tuple[Route, Kind]],
        requests_topic: str,
        publisher: Publisher,
        metrics: ConsumerMetrics,
        on_retry: RetryHook | None,
        on_dead_letter: DeadLetterHook | None,
        breakers: Breakers | None = None,
        repeats: RecentIds | None = None,
        held: HeldKeys | None = None,
        transactional: bool = False,
        lines: KeyLines | None = None,
    ) -> None:
        self.group = group
        self.reads = reads
        self.requests_topic = requests_topic
        self.publisher = publisher
        self.metrics = metrics
        self.on_retry = on_retry
        self.on_dead_letter = on_dead_letter
        self.in_place: dict[Partition, InPlace] = {}
        """Records retried in place, by partition; kept across a rebalance while their
        partition's wait is parked (see :meth:`redrive.consumer.pauses.PauseBook.release`)."""
        self.handled: dict[str, int] = {}
        """Records handled in the current batch, by route topic."""
        self.breakers = breakers if breakers is not None else Breakers()
        """The pause handlers' circuit breakers (the loop ticks them each turn)."""
        self.circuits = self.breakers.by_topic
        self.repeats = repeats if repeats is not None else RecentIds()
        """The ids of redelivered records handled lately (:mod:`redrive.consumer.repeats`)."""
        self.transactional = transactional
        """Hand-offs count once the App's transaction commits (ids staged till then)."""
        self.held = held if held is not None else HeldKeys(publisher, {})
        """The keys of ordered routes waiting in the retry service (``ordering="key"``)."""
        self.lines = lines if lines is not None else KeyLines(publisher, {}, {})
        """The lines of held keys of ordered routes kept in the tier topics."""
        self.keys = KeyOrder(group, requests_topic, publisher, metrics, self.held, self.lines)
        """Key order through retries (:mod:`redrive.consumer.key_order`)."""

    def process(self, record: KafkaMessage, topic: str, partition: int, offset: int) -> Wait | None:
        """Deal with one record; None when it is dealt with, else how long to wait."""
        route, kind = self.reads[topic]
        message = self.prepare(route, kind, record, topic, partition, offset)
        if not isinstance(message, Message):
            return message  # dealt with before its handler (a dead letter), or waiting
        # (Checked here first: most routes keep no order, and the call would cost.)
        if route.ordering is not None and self.goes_behind(route, message):
            return None  # its key waits for a retry: so does it
        state = self.in_place.get((topic, partition)) if self.in_place else None
        if state is not None and state.offset != offset:
            state = None
        circuit = self.circuits.get(route.topic) if self.circuits else None
        if circuit is not None and circuit.state:  # open or half-open: may it pass?
            held = circuit.admit()
            if held is not None:
                return held
        try:
            result = route.handler(message)
        except Exception as exc:  # noqa: BLE001 - the handler's failure is what we handle
            return self._failed(route, message, state, exc)
        if result is not None and inspect.isawaitable(result):
            # An async function behind a plain one: its body never ran.
            return self._failed(route, message, state, refuse_awaitable(result))
        handled = self.handled
        handled[route.topic] = handled.get(route.topic, 0) + 1
        if message.retry is not None:
            self.delivery_done(route, message)
        if state is not None:
            del self.in_place[(topic, partition)]
        if circuit is not None:
            circuit.succeeded()
        return None

    def state_of(self, topic: str, partition: int, offset: int) -> InPlace | None:
        """The in-place retry state of the record at ``offset``, if it is being retried
        in place (blocking, pause)."""
        state = self.in_place.get((topic, partition)) if self.in_place else None
        return state if state is not None and state.offset == offset else None

    def admit(self, route: Route) -> Wait | None:
        """Whether the route's circuit breaker lets a record reach its handler now
        (None), else the wait that keeps it back (the pause strategy's breaker)."""
        circuit = self.circuits.get(route.topic) if self.circuits else None
        return circuit.admit() if circuit is not None and circuit.state else None

    def succeeded(self, route: Route, message: Message, state: InPlace | None) -> None:
        """A record's handler ended well outside :meth:`process` (an async handler):
        counted, its in-place retry (if any) over, its breaker told."""
        self.handled[route.topic] = self.handled.get(route.topic, 0) + 1
        self.delivery_done(route, message)
        if state is not None:
            self.in_place.pop((message.topic, message.partition), None)
        circuit = self.circuits.get(route.topic) if self.circuits else None
        if circuit is not None:
            circuit.succeeded()

    def goes_behind(self, route: Route, message: Message) -> bool:
        """A record of a held key of an ordered route goes behind the record its key
        waits for (True), instead of reaching its handler (:mod:`.key_order`)."""
        return self.keys.goes_behind(route, message)

    def delivery_done(self, route: Route, message: Message) -> None:
        """A redelivered record was handled: remembered, and its key's queue released."""
        retry = message.retry
        if retry is not None:
            self.remember(message)
            if retry.order is not None:
                self.keys.release(route, retry, message.key)

    def remember(self, message: Message) -> None:
        """A redelivered record was handled: a later delivery of it is a repeat (at
        once: also one arriving before the transaction commits)."""
        if message.retry is not None and message.retry.id is not None:
            self.repeats.add(message.retry.id)
            if self.transactional:
                self.repeats.stage(message.retry.id)

    def remember_handed_off(self, delivery: RetryHeaders | None, done: bool) -> None:
        """A redelivered record's failure was handed off (``done``: as a dead letter,
        else as its next retry): a later delivery of it is a repeat, which would
        fail again and hand the same off twice. Once committed, with transactions."""
        if delivery is None or delivery.id is None:
            return
        if self.transactional:
            self.repeats.stage(delivery.id)
        else:
            self.repeats.add(delivery.id, done)

    def prepare(
        self,
        route: Route,
        kind: Kind,
        record: KafkaMessage,
        topic: str,
        partition: int,
        offset: int,
    ) -> Message | Wait | None:
        """A record up to its handler: the Message to hand it (single or in a batch),
        None when it is dealt with already (unreadable headers, a value that does not
        deserialize: a dead letter), or a Wait (a tier record not due yet)."""
        headers, unreadable = read_headers(record)
        delivery = None
        user_headers = headers
        if headers and any(is_redrive_header(name) for name, _ in headers):
            delivery = read_delivery(headers, self.group)
            user_headers = [(k, v) for k, v in headers if not is_redrive_header(k)]
        if unreadable is not None:
            attempt = delivery.attempt + 1 if delivery else 1
            failure = _failure(record, topic, partition, offset, user_headers, delivery, attempt)
            self._reject(route, failure, None, UnreadableHeadersError(unreadable), unreadable)
            return None
        if delivery is not None and delivery.id is not None and delivery.id in self.repeats:
            self.metrics.records.labels(route.topic, "repeat_skipped").inc()
            log.info(
                "repeat delivery skipped: handled already",
                topic=topic,
                partition=partition,
                offset=offset,
                redrive_id=delivery.id,
            )
            # Released again if it left its queue: the first release may be lost.
            if delivery.order is not None and self.repeats.left_queue(delivery.id):
                self.keys.release(route, delivery, record.key())
            return None
        if delivery is not None and kind != "source":  # a tier record may not be due yet
            wait = route.strategy.hold(route, topic, partition, offset, delivery)
            if wait is not None:
                return wait
        state = self.in_place.get((topic, partition)) if self.in_place else None
        if state is not None and state.offset != offset:
            state = None
        failures = state.failures if state else (delivery.attempt if delivery else 0)
        raw_value = record.value()
        deserialize = route.value_deserializer
        try:
            # A tombstone (no value) reaches the handler as None, not through the deserializer.
            value = (
                raw_value if deserialize is None or raw_value is None else deserialize(raw_value)
            )
        except Exception as exc:  # noqa: BLE001 - any deserializer failure is the record's
            shown = safe_repr(exc, limit=None)
            error: BaseException = DeserializationError(f"cannot deserialize: {shown}")
            error.__cause__ = exc
            failure = _failure(
                record, topic, partition, offset, user_headers, delivery, failures + 1
            )
            problem = f"value cannot be deserialized ({shown})"
            self._reject(route, failure, None, error, problem)
            return None
        stamp_type, stamp = record.timestamp()  # _timestamp(record), without a call
        message = Message(
            topic,
            partition,
            offset,
            record.key(),
            value,
            raw_value,
            user_headers,
            stamp if stamp_type and stamp >= 0 else None,
            failures + 1,
            delivery,
        )
        return message

    def unprocessable(
        self, record: KafkaMessage, topic: str, partition: int, offset: int, cause: Exception
    ) -> None:
        """redrive failed on a record (a bug, or input no check foresaw): a dead letter
        built from the record alone, so that the consumer goes on. Should even that
        fail (the producer refuses it), the error stops the loop, uncommitted."""
        log.exception(
            "cannot process record; dead-lettering it",
            topic=topic,
            partition=partition,
            offset=offset,
        )
        self.in_place.pop((topic, partition), None)
        route, _ = self.reads[topic]
        circuit = self.circuits.get(route.topic) if self.circuits else None
        if circuit is not None:
            circuit.released()  # not a probe's outcome
        readable = read_headers(record)[0]
        headers = [(k, v) for k, v in readable if not is_redrive_header(k)]
        shown = safe_repr(cause)
        error = UnprocessableRecordError(f"redrive could not process this record: {shown}")
        error.__cause__ = cause
        problem = f"redrive could not process this record ({shown})"
        failure = _failure(record, topic, partition, offset, headers, None, 1)
        self._reject(route, failure, None, error, problem)

    def failed(
        self,
        route: Route,
        message: Message,
        error: BaseException,
        state: InPlace | None = None,
    ) -> Wait | None:
        """A handled record failed with ``error`` outside :meth:`process` (one record of
        a batch, an async handler): routed and carried out as if its own handler had
        raised it; ``state``: its in-place retry so far (:meth:`state_of`)."""
        return self._failed(route, message, state, error)

    def _failed(
        self, route: Route, message: Message, state: InPlace | None, error: BaseException
    ) -> Wait | None:
        failure = FailedRecord(
            message.topic,
            message.partition,
            message.offset,
            message.timestamp_ms,
            message.key,
            message.raw_value,
            message.headers,
            message.retry,
            message.attempt,
        )
        outcome = route.router.route(
            failure,
            error,
            retry_to=route.strategy.retry_to(route, failure, self.requests_topic),
            dead_letters=self._dead_letter_topic(route),
            home=route.topic,
            first_failure_ms=state.first_failure_ms if state else None,
        )
        tp = (message.topic, message.partition)
        log.info(
            "handler failed",
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            attempt=message.attempt,
            error=safe_repr(error),
            decision=str(outcome.decision)
            if isinstance(outcome, DeadLettered)
            else f"retry in {outcome.decision.delay_ms} ms",
        )
        # The pause strategy's breaker counts the failure, and may widen the wait.
        circuit = self.circuits.get(route.topic) if self.circuits else None
        if isinstance(outcome, DeadLettered):
            self.in_place.pop(tp, None)
            self._dead_letter(route, failure, outcome, message, error)
            self.remember_handed_off(message.retry, done=True)
            if message.retry is not None and message.retry.order is not None:
                self.keys.release(route, message.retry, message.key)
            return None if circuit is None else circuit.failed(outcome, None)
        wait = self._retry(route, failure, outcome, message, state, error)
        return wait if circuit is None else circuit.failed(outcome, wait)

    def _retry(
        self,
        route: Route,
        failure: FailedRecord,
        outcome: Retried,
        message: Message,
        state: InPlace | None,
        error: BaseException,
    ) -> Wait | None:
        """Carry out a retry: hand its request off, or wait for it in place. Counted
        once the retry is under way (a hand-off that raised is not one)."""
        if outcome.request is not None and outcome.target is not None:
            request = outcome.request
            ordered = route.ordering is not None and failure.key is not None
            if ordered:  # the head of its key's queue: the key's later records wait
                request = dataclasses.replace(request, order="key")
            self.publisher.send(
                outcome.target.topic,
                key=failure.key,
                value=failure.value,
                user_headers=failure.headers,
                redrive=request,
                partition=outcome.target.partition,
            )
            if ordered:
                self.keys.hold(route, request, failure.key, outcome.target.topic)
            self.remember_handed_off(failure.delivery, done=False)
        wait = route.strategy.wait(outcome.decision)
        self.metrics.records.labels(route.topic, "retried").inc()
        self._hook(self.on_retry, message, outcome.decision, error)
        if wait is not None:
            first = state.first_failure_ms if state else outcome.failed_at_ms
            tp = (failure.topic, failure.partition)
            self.in_place[tp] = InPlace(failure.offset, failure.attempt, first)
        return wait

    def _reject(
        self,
        route: Route,
        failure: FailedRecord,
        message: Message | None,
        error: BaseException,
        problem: str,
    ) -> None:
        """A record that cannot reach its handler: a dead letter, without the policy."""
        dead_letters = self._dead_letter_topic(route)
        outcome = route.router.reject(
            failure, error, problem, dead_letters=dead_letters, home=route.topic
        )
        self._dead_letter(route, failure, outcome, message, error)
        self.remember_handed_off(failure.delivery, done=True)
        if failure.delivery is not None and failure.delivery.order is not None:
            self.keys.release(route, failure.delivery, failure.key)

    def _dead_letter_topic(self, route: Route) -> str:
        return self.requests_topic if route.dead_letters == "service" else route.dlq_topic

    def _dead_letter(
        self,
        route: Route,
        failure: FailedRecord,
        outcome: DeadLettered,
        message: Message | None,
        error: BaseException,
    ) -> None:
        self.publisher.send(
            outcome.topic,
            key=failure.key,
            value=failure.value,
            user_headers=failure.headers,
            redrive=outcome.headers,
        )
        self.metrics.records.labels(route.topic, "dead_lettered").inc()
        log.warning(
            "dead-lettered",
            topic=failure.topic,
            partition=failure.partition,
            offset=failure.offset,
            to=outcome.topic,
            reason=outcome.decision.text,
        )
        self._hook(self.on_dead_letter, message, outcome.decision, error)

    def _hook(self, hook: Callable[..., None] | None, *args: Any) -> None:
        if hook is None:
            return
        try:
            hook(*args)
        except Exception:
            log.exception("hook failed", hook=getattr(hook, "__name__", repr(hook)))


def _failure(
    record: KafkaMessage,
    topic: str,
    partition: int,
    offset: int,
    headers: list[Header],
    delivery: RetryHeaders | None,
    attempt: int,
) -> FailedRecord:
    """A record that did not reach its handler, as the router takes it."""
    return FailedRecord(
        topic,
        partition,
        offset,
        message_time(record),
        record.key(),
        record.value(),
        headers,
        delivery,
        attempt,
    )


def safe_repr(value: object, limit: int | None = 200) -> str:
    """repr() for logs and reasons, which a broken __repr__ must not turn into a crash."""
    try:
        return repr(value)[:limit]
    except Exception:  # noqa: BLE001 - any failure of user code in __repr__
        return f"<unprintable {type(value).__name__}>"
