"""One record's way through the App: the per-record pipeline of its route.

decode (headers, value) → repeat filter → tier wait → the route's gates (key order,
breaker: :mod:`redrive.consumer.steps`) → its handler → its outcome
(:mod:`redrive.consumer.outcomes`). The sync loop runs it whole (:meth:`process`);
the async and batch runners run the same steps around their own handler calls
(:meth:`prepare`, :meth:`gate`, then :attr:`outcomes`).

Invariant: :meth:`Pipeline.process` deals with every record it is given. It returns
None once the record is dealt with (handled; its retry handed to Kafka; dead-lettered;
put behind its key; a repeat skipped; a return refused), or a :class:`Wait` for a
record to handle again at the same offset later (a retry in place, a tier record not
due yet, a breaker).

A record's redrive headers count only where the App believes them
(:mod:`redrive.consumer.refusals`, asked in :meth:`Pipeline.prepare` before anything
else reads them): otherwise, on a source topic the record is a new one, and on a
retry path it is refused, never handled and never a repeat of another.

No record stops the loop: a record whose headers cannot be read, or whose value does
not deserialize, is a dead letter with its raw key and value; any other exception of
redrive's own on a record is turned into one by :meth:`Pipeline.unprocessable`. Only
a hand-off the producer refuses for good stops the App, uncommitted (nothing is lost).

The success path is the hot path: per record only the header read, the handler call
and a few dict operations; a route without gates runs an empty tuple; counts are kept
per turn (:attr:`Outcomes.handled`).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

import structlog
from confluent_kafka import Message as KafkaMessage

from redrive.consumer.brakes import Brakes
from redrive.consumer.done_before import DoneBefore
from redrive.consumer.errors import (
    DeserializationError,
    UnprocessableRecordError,
    UnreadableHeadersError,
)
from redrive.consumer.handlers import refuse_awaitable
from redrive.consumer.kept_lines import KeptLines
from redrive.consumer.message import Message
from redrive.consumer.outcomes import InPlace, Outcomes, failed_record, safe_repr
from redrive.consumer.refusals import NOT_A_RETURN
from redrive.consumer.routes import Kind, Route
from redrive.consumer.steps import DealtWith, Steps
from redrive.consumer.strategies import Wait
from redrive.consumer.strategies.pause import Breakers
from redrive.headers import Header, RetryHeaders, is_redrive_header, read_replay, read_run
from redrive.kafka import message_time, read_headers
from redrive.returns import ReturnCheck
from redrive.router import FailedRecord, read_delivery

log = structlog.get_logger("redrive.consumer")

Read = tuple[Steps, Kind]
"""What a topic is read for: its route's steps, and which of the route's topics it is."""


class Pipeline:
    """The records of one App (see the module)."""

    def __init__(
        self,
        group: str,
        reads: Mapping[str, tuple[Route, Kind]],
        steps: Mapping[str, Steps],
        outcomes: Outcomes,
        breakers: Breakers,
        brakes: Brakes | None = None,
        kept: KeptLines | None = None,
        check: ReturnCheck | None = None,
    ) -> None:
        self.group = group
        self.check = check or ReturnCheck()
        """What a record's redrive headers must pass to be believed (the App's keys)."""
        self.signed_returns = self.check.keys is not None
        """With keys, a record on a retry path must carry signed redrive headers."""
        self.reads: dict[str, Read] = {
            topic: (steps[route.topic], kind) for topic, (route, kind) in reads.items()
        }
        self.returns = frozenset(topic for topic, (_, kind) in reads.items() if kind != "source")
        """The topics records come back on after a retry (tiers, per-group topics)."""
        self.outcomes = outcomes
        self.breakers = breakers
        """The pause handlers' circuit breakers (the loop ticks them each turn)."""
        self.brakes = brakes or Brakes()
        """The routes' dead-letter brakes (the loop ticks them each turn)."""
        self.in_place = outcomes.in_place
        self.handled = outcomes.handled
        self.kept = kept or KeptLines()
        """The records kept behind held keys: the lines whose head is done are handled
        by :meth:`drain`."""
        self.ready = self.kept.ready
        self.done_before = DoneBefore()
        """Records a partition's last commit named as dealt with beyond its position."""

    def process(self, record: KafkaMessage, topic: str, partition: int, offset: int) -> Wait | None:
        """Deal with one record; None when it is dealt with, else how long to wait."""
        steps, kind = self.reads[topic]
        message = self.prepare(steps, kind, record, topic, partition, offset)
        if not isinstance(message, Message):
            return message  # dealt with before its handler (a dead letter), or waiting
        for gate in steps.gates:  # none for most routes
            stop = gate(message)
            if stop is not None:
                return None if isinstance(stop, DealtWith) else stop
        state = self.in_place.get((topic, partition)) if self.in_place else None
        if state is not None and state.offset != offset:
            state = None
        return self.handle(steps, message, state)

    def handle(self, steps: Steps, message: Message, state: InPlace | None) -> Wait | None:
        """A record past its gates: its handler, then its outcome."""
        route = steps.route
        try:
            result = route.handler(message)
        except Exception as exc:  # noqa: BLE001 - the handler's failure is what we handle
            return self.outcomes.failed(steps, message, exc, state)
        if result is not None and inspect.isawaitable(result):
            # An async function behind a plain one: its body never ran.
            return self.outcomes.failed(steps, message, refuse_awaitable(result), state)
        # Outcomes.succeeded, inline: the hot path.
        handled = self.handled
        handled[route.topic] = handled.get(route.topic, 0) + 1
        if message.retry is not None:
            self.outcomes.delivery_done(steps, message)
        if state is not None:
            del self.in_place[(message.topic, message.partition)]
        if steps.circuit is not None:
            steps.circuit.succeeded()
        return None

    def drain(self) -> None:
        """The records kept behind keys whose head is done, each line in offset order,
        before any later record of their keys (:mod:`redrive.consumer.kept_lines`).
        Each goes through its route's gates again; once one of them fails and becomes
        its key's new head with a short retry, the rest of the line goes back behind
        it whole (not record by record: a line is not read again at each failure)."""
        kept = self.kept
        ready = kept.ready
        while ready:
            topic, line = ready.popleft()
            steps = self.reads[topic][0]
            first = line[0]  # a line is one key's, on one partition
            where, key = (first.topic, first.partition), first.key
            assert key is not None  # unkeyed records are never kept
            while line:
                message = line.popleft()
                stop: Wait | DealtWith | None = None
                try:
                    stop = self.gate(steps, message)
                    if stop is None:
                        self.handle(steps, message, None)
                except Exception as exc:  # noqa: BLE001 - no record may stop the consumer
                    self._kept_unprocessable(steps, message, exc)
                if isinstance(stop, Wait):
                    # Its key is held again and its partition at the bound: back in
                    # the line it held a place in already, with the rest.
                    line.appendleft(message)
                if line and (isinstance(stop, Wait) or kept.keeping(where, key)):
                    kept.put_back(where, key, line)

    def _kept_unprocessable(self, steps: Steps, message: Message, cause: Exception) -> None:
        """redrive failed on a kept record: a dead letter, as :meth:`unprocessable`."""
        log.exception(
            "cannot process record; dead-lettering it",
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
        )
        shown = safe_repr(cause)
        error = UnprocessableRecordError(f"redrive could not process this record: {shown}")
        error.__cause__ = cause
        failure = failed_record(message)
        self.outcomes.reject(
            steps, failure, error, f"redrive could not process this record ({shown})"
        )

    def gate(self, steps: Steps, message: Message) -> Wait | DealtWith | None:
        """The route's gates for a record read already (async runners): None lets it
        reach its handler."""
        for gate in steps.gates:
            stop = gate(message)
            if stop is not None:
                return stop
        return None

    def state_of(self, topic: str, partition: int, offset: int) -> InPlace | None:
        """The in-place retry state of the record at ``offset``, if it is being retried
        in place (blocking, pause)."""
        state = self.in_place.get((topic, partition)) if self.in_place else None
        return state if state is not None and state.offset == offset else None

    def prepare(
        self,
        steps: Steps,
        kind: Kind,
        record: KafkaMessage,
        topic: str,
        partition: int,
        offset: int,
    ) -> Message | Wait | None:
        """A record up to its gates: the Message to hand it (single or in a batch),
        None when it is dealt with already (unreadable headers, a repeat, a value that
        does not deserialize: a dead letter; a return refused), or a Wait (a tier record
        not due yet)."""
        headers, unreadable = read_headers(record)
        delivery = replay = run = doubt = None
        user_headers = headers
        if headers and any(is_redrive_header(name) for name, _ in headers):
            delivery = read_delivery(headers, self.group)
            replay = read_replay(headers)
            user_headers = [(k, v) for k, v in headers if not is_redrive_header(k)]
            if delivery is not None:
                # A tier record names the route's topic, a delivery the topic it is on.
                named = steps.route.topic if kind == "tier" else topic
                doubt = self.check.doubt(
                    headers, record.key(), record.value(), delivery, (topic, partition), named
                )
                if doubt is None:
                    run = read_run(headers)
                else:
                    delivery = None  # nothing it says counts
        if delivery is None and kind != "source" and self.signed_returns and doubt is None:
            doubt = NOT_A_RETURN
        if unreadable is not None:
            attempt = delivery.attempt + 1 if delivery else 1
            failure = _failure(
                record, topic, partition, offset, user_headers, delivery, attempt, replay
            )
            error = UnreadableHeadersError(unreadable)
            self.outcomes.reject(steps, failure, error, unreadable)
            return None
        if doubt is not None:
            if kind != "source":
                failure = _failure(record, topic, partition, offset, user_headers, None, 1)
                self.outcomes.refuse(steps, failure, doubt)
                return None
            if self.state_of(topic, partition, offset) is None:  # once, not per retry in place
                self._untrusted(steps, (topic, partition, offset), doubt)
        elif delivery is not None:
            if delivery.id is not None:
                seen = self.outcomes.repeats.entry(delivery.id, record.key(), record.value())
                if seen in self.outcomes.repeats:
                    self._skip_repeat(steps, delivery, seen, record, (topic, partition, offset))
                    return None
            if kind != "source":  # a tier record may not be due yet
                wait = steps.route.strategy.wait_until_due(
                    steps.route, topic, partition, offset, delivery
                )
                if wait is not None:
                    return wait
        state = self.in_place.get((topic, partition)) if self.in_place else None
        if state is not None and state.offset != offset:
            state = None
        failures = state.failures if state else (delivery.attempt if delivery else 0)
        raw_value = record.value()
        deserialize = steps.route.value_deserializer
        try:
            # A tombstone (no value) reaches the handler as None, not through the deserializer.
            value = (
                raw_value if deserialize is None or raw_value is None else deserialize(raw_value)
            )
        except Exception as exc:  # noqa: BLE001 - any deserializer failure is the record's
            shown = safe_repr(exc, limit=None)
            problem = DeserializationError(f"cannot deserialize: {shown}")
            problem.__cause__ = exc
            failure = _failure(
                record, topic, partition, offset, user_headers, delivery, failures + 1, replay
            )
            self.outcomes.reject(steps, failure, problem, f"value cannot be deserialized ({shown})")
            return None
        stamp_type, stamp = record.timestamp()  # _timestamp(record), without a call
        return Message(
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
            replay=replay,
            run=run,
        )

    def skipped(self, topic: str, partition: int, offset: int) -> None:
        """A record the last commit named as dealt with was read again: skipped."""
        steps, _ = self.reads[topic]
        self.outcomes.metrics.records.labels(steps.route.topic, "repeat_skipped").inc()
        log.info(
            "record dealt with before skipped", topic=topic, partition=partition, offset=offset
        )

    def _skip_repeat(
        self,
        steps: Steps,
        delivery: RetryHeaders,
        entry: str,
        record: KafkaMessage,
        read_at: tuple[str, int, int],
    ) -> None:
        """A redelivery handled already (:mod:`redrive.consumer.repeats`; ``entry``, its
        id in the window): skipped."""
        topic, partition, offset = read_at
        self.outcomes.metrics.records.labels(steps.route.topic, "repeat_skipped").inc()
        log.info(
            "repeat delivery skipped: handled already",
            topic=topic,
            partition=partition,
            offset=offset,
            redrive_id=delivery.id,
        )
        # Released again if it left its queue: the first release may be lost.
        if delivery.order is not None and self.outcomes.repeats.left_queue(entry):
            self.outcomes.release(steps, delivery, record.key())

    def _untrusted(self, steps: Steps, read_at: tuple[str, int, int], why: str) -> None:
        """A record on a source topic with redrive headers the App cannot believe (a
        copy, or a forgery): handled as a new record, counted and logged."""
        topic, partition, offset = read_at
        self.outcomes.metrics.records.labels(steps.route.topic, "untrusted_headers").inc()
        log.info(
            "redrive headers not believed; handled as a new record",
            topic=topic,
            partition=partition,
            offset=offset,
            reason=why,
        )

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
        steps, _ = self.reads[topic]
        if steps.circuit is not None:
            steps.circuit.released()  # not a probe's outcome
        readable = read_headers(record)[0]
        headers = [(k, v) for k, v in readable if not is_redrive_header(k)]
        shown = safe_repr(cause)
        error = UnprocessableRecordError(f"redrive could not process this record: {shown}")
        error.__cause__ = cause
        problem = f"redrive could not process this record ({shown})"
        failure = _failure(record, topic, partition, offset, headers, None, 1)
        self.outcomes.reject(steps, failure, error, problem)


def _failure(
    record: KafkaMessage,
    topic: str,
    partition: int,
    offset: int,
    headers: list[Header],
    delivery: RetryHeaders | None,
    attempt: int,
    replay: tuple[int, int] | None = None,
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
        replay,
    )
