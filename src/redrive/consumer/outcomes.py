"""What becomes of a record once its handler ran, or once it cannot reach it: the
pipeline's last step, shared by the sync, async and batch runners.

Invariant: a success is counted, remembered when it was a redelivery (a repeat of it
is skipped), and its key's queue released; a failure is routed by the failure router
(``route.router``, :mod:`redrive.router`) and carried out: its retry handed off (or
waited for in place) or its dead letter written, counted once under way, its hooks
called; a hand-off of a redelivered record is remembered too (a repeat would hand the
same off twice). The route's breaker and key order hear of every outcome through its
:class:`~redrive.consumer.steps.Steps`. A return the App cannot believe is refused
(:meth:`Outcomes.refuse`) as the App's ``returns`` rule says, counted once as
``refused``, and nothing of it is remembered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from redrive.consumer.errors import RefusedReturnError
from redrive.consumer.message import Message
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.offsets import Partition
from redrive.consumer.publisher import Publisher
from redrive.consumer.refusals import DEFAULT_RULE, RefuseAndCount, ReturnRule
from redrive.consumer.repeats import RecentIds
from redrive.consumer.routes import Route
from redrive.consumer.settings import Hooks
from redrive.consumer.steps import Steps
from redrive.consumer.strategies import Wait
from redrive.headers import RetryHeaders
from redrive.policy import DeadLetter, DeadLetterReason
from redrive.router import DeadLettered, FailedRecord, Retried, given_up

log = structlog.get_logger("redrive.consumer")


@dataclass(frozen=True, slots=True)
class InPlace:
    """A record being retried in place (blocking, pause): its failures so far."""

    offset: int
    failures: int
    first_failure_ms: int


class Outcomes:
    """Carries out the outcomes of one App's records (see the module)."""

    def __init__(
        self,
        group: str,
        requests_topic: str,
        publisher: Publisher,
        metrics: ConsumerMetrics,
        hooks: Hooks,
        repeats: RecentIds,
        transactional: bool,
        returns: ReturnRule = DEFAULT_RULE,
        signing: bool = False,
    ) -> None:
        self.group = group
        self.requests_topic = requests_topic
        self.publisher = publisher
        self.metrics = metrics
        self.hooks = hooks
        self.repeats = repeats
        """The ids of redelivered records handled lately (:mod:`redrive.consumer.repeats`)."""
        self.transactional = transactional
        """Hand-offs count once the App's transaction commits (ids staged till then)."""
        self.returns = returns
        """What becomes of a return the App cannot believe (:mod:`redrive.consumer.refusals`)."""
        self.refusal_reason = (
            DeadLetterReason.INVALID_SIGNATURE if signing else DeadLetterReason.INVALID_REQUEST
        )
        """A refused return's reason, for the hook (with keys, it is not signed by them
        or names another place; without, it names another place). Its dead letter says
        it in words: ``redrive-reason-code`` names a policy's reasons only."""
        self.in_place: dict[Partition, InPlace] = {}
        """Records retried in place, by partition; kept across a rebalance while their
        partition's wait is parked (see :meth:`redrive.consumer.pauses.PauseBook.release`)."""
        self.handled: dict[str, int] = {}
        """Records handled in the current turn, by route topic (counted once a turn)."""

    # ------------------------------------------------------------------ successes

    def succeeded(self, steps: Steps, message: Message, state: InPlace | None) -> None:
        """A record's handler ended well: counted, its in-place retry (if any) over, its
        breaker told, its redelivery remembered and its key's queue released."""
        route = steps.route
        self.handled[route.topic] = self.handled.get(route.topic, 0) + 1
        if message.retry is not None:
            self.delivery_done(steps, message)
        if state is not None:
            self.in_place.pop((message.topic, message.partition), None)
        if steps.circuit is not None:
            steps.circuit.succeeded()

    def batch_succeeded(
        self, steps: Steps, messages: list[Message], failed: Mapping[int, BaseException]
    ) -> None:
        """A batch's handler ended: its records but the ``failed`` (by index) succeeded,
        counted at once. (Batch routes keep no key order and have no breaker.)"""
        for index, message in enumerate(messages):
            if message.retry is not None and index not in failed:
                self.remember(message)
        handled = len(messages) - len(failed)
        if handled:
            topic = steps.route.topic
            self.handled[topic] = self.handled.get(topic, 0) + handled

    def delivery_done(self, steps: Steps, message: Message) -> None:
        """A redelivered record was handled: remembered, and its key's queue released."""
        retry = message.retry
        if retry is not None:
            self.remember(message)
            if retry.order is not None:
                self.release(steps, retry, message.key)

    def remember(self, message: Message) -> None:
        """A redelivered record was handled: a later delivery of it is a repeat (at
        once: also one arriving before the transaction commits)."""
        if message.retry is not None and message.retry.id is not None:
            entry = self.repeats.entry(message.retry.id, message.key, message.raw_value)
            self.repeats.add(entry)
            if self.transactional:
                self.repeats.stage(entry)

    def release(self, steps: Steps, delivery: RetryHeaders, key: bytes | None) -> None:
        """The App is done with a record of a key's queue: the next may come."""
        if steps.key_order is not None:
            steps.key_order.release(steps.route, delivery, key)

    # ------------------------------------------------------------------ failures

    def decide(
        self,
        route: Route,
        message: Message,
        error: BaseException,
        first_failure_ms: int | None = None,
    ) -> tuple[FailedRecord, Retried | DeadLettered]:
        """What the route's failure router makes of a handled record's failure (logged);
        ``first_failure_ms``: when a record retried in place first failed."""
        failure = failed_record(message)
        outcome = route.router.route(
            failure,
            error,
            retry_to=route.strategy.retry_to(route, failure, self.requests_topic),
            dead_letters=self.dead_letter_topic(route),
            home=route.topic,
            first_failure_ms=first_failure_ms,
        )
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
        return failure, outcome

    def failed(
        self, steps: Steps, message: Message, error: BaseException, state: InPlace | None = None
    ) -> Wait | None:
        """A handled record failed with ``error``: routed and carried out; ``state``:
        its in-place retry so far. The wait the runner must do, if any."""
        route = steps.route
        first = state.first_failure_ms if state else None
        failure, outcome = self.decide(route, message, error, first)
        # The route's breaker and brake hear of the failure; the breaker may widen the wait.
        circuit = steps.circuit
        if isinstance(outcome, DeadLettered):
            self.in_place.pop((message.topic, message.partition), None)
            self.dead_letter(route, failure, outcome, message, error)
            self.remember_handed_off(failure, done=True)
            if message.retry is not None and message.retry.order is not None:
                self.release(steps, message.retry, message.key)
            return None if circuit is None else circuit.failed(outcome, None)
        wait = self._retry(steps, failure, outcome, message, state, error)
        return wait if circuit is None else circuit.failed(outcome, wait)

    def _retry(
        self,
        steps: Steps,
        failure: FailedRecord,
        outcome: Retried,
        message: Message,
        state: InPlace | None,
        error: BaseException,
    ) -> Wait | None:
        """Carry out a retry: hand its request off, or wait for it in place. Counted
        once the retry is under way (a hand-off that raised is not one)."""
        route = steps.route
        if outcome.request is not None and outcome.target is not None:
            request = outcome.request
            key = failure.key
            order = steps.key_order if key is not None else None
            if order is not None:  # the head of its key's queue: the key's later records wait
                request = dataclasses.replace(request, order="key")
            self.publisher.send(
                outcome.target.topic,
                key=key,
                value=failure.value,
                user_headers=failure.headers,
                redrive=request,
                partition=outcome.target.partition,
            )
            if order is not None and key is not None:
                order.handed_off(route, request, key, outcome.target.topic, message.run)
            self.remember_handed_off(failure, done=False)
        wait = route.strategy.wait(outcome.decision)
        self.metrics.records.labels(route.topic, "retried").inc()
        self.call_hook(self.hooks.on_retry, message, outcome.decision, error)
        if wait is not None:
            first = state.first_failure_ms if state else outcome.failed_at_ms
            tp = (failure.topic, failure.partition)
            self.in_place[tp] = InPlace(failure.offset, failure.attempt, first)
        return wait

    def reject(
        self, steps: Steps, failure: FailedRecord, error: BaseException, problem: str
    ) -> None:
        """A record that cannot reach its handler: a dead letter, without the policy."""
        route = steps.route
        dead_letters = self.dead_letter_topic(route)
        outcome = route.router.reject(
            failure, error, problem, dead_letters=dead_letters, home=route.topic
        )
        self.dead_letter(route, failure, outcome, None, error)
        self.remember_handed_off(failure, done=True)
        if failure.delivery is not None and failure.delivery.order is not None:
            self.release(steps, failure.delivery, failure.key)

    def remember_handed_off(self, failure: FailedRecord, done: bool) -> None:
        """A redelivered record's failure was handed off (``done``: as a dead letter,
        else as its next retry): a later delivery of it is a repeat, which would
        fail again and hand the same off twice. Once committed, with transactions."""
        delivery = failure.delivery
        if delivery is None or delivery.id is None:
            return
        entry = self.repeats.entry(delivery.id, failure.key, failure.value)
        if self.transactional:
            self.repeats.stage(entry)
        else:
            self.repeats.add(entry, done)

    def refuse(self, steps: Steps, failure: FailedRecord, why: str) -> None:
        """A record on a retry path whose redrive headers the App cannot believe
        (``why``; ``failure`` is the record as read, with no delivery): never handled,
        counted as ``refused``, and dead-lettered or dropped as the App's ``returns``
        rule says. Its route's breaker, brake and key order hear nothing of it: it is
        none of their records."""
        route = steps.route
        self.metrics.records.labels(route.topic, "refused").inc()
        where = {"topic": failure.topic, "partition": failure.partition, "offset": failure.offset}
        if isinstance(self.returns, RefuseAndCount):
            log.warning("return refused: not handled, dropped", **where, reason=why)
            return
        text = f"return refused: {why}"
        error = RefusedReturnError(text)
        dead_letters = self.dead_letter_topic(route)
        outcome = route.router.reject(
            failure, error, text, dead_letters=dead_letters, home=route.topic
        )
        reason = self.refusal_reason
        decision = DeadLetter(reason, text, failure.attempt)
        headers = dataclasses.replace(outcome.headers, reason=text, reason_code=given_up(reason))
        self.publisher.send(
            dead_letters,
            key=failure.key,
            value=failure.value,
            user_headers=failure.headers,
            redrive=headers,
        )
        log.warning("return refused: dead-lettered", **where, to=dead_letters, reason=why)
        self.call_hook(self.hooks.on_dead_letter, None, decision, error)

    def dead_letter_topic(self, route: Route) -> str:
        return self.requests_topic if route.dead_letters == "service" else route.dlq_topic

    def dead_letter(
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
        self.call_hook(self.hooks.on_dead_letter, message, outcome.decision, error)

    def call_hook(self, hook: Callable[..., None] | None, *args: Any) -> None:
        if hook is None:
            return
        try:
            hook(*args)
        except Exception:
            log.exception("hook failed", hook=getattr(hook, "__name__", repr(hook)))


def safe_repr(value: object, limit: int | None = 200) -> str:
    """repr() for logs and reasons, which a broken __repr__ must not turn into a crash."""
    try:
        return repr(value)[:limit]
    except Exception:  # noqa: BLE001 - any failure of user code in __repr__
        return f"<unprintable {type(value).__name__}>"


def failed_record(message: Message) -> FailedRecord:
    """A record that reached its handler, as the failure router takes it."""
    return FailedRecord(
        message.topic,
        message.partition,
        message.offset,
        message.timestamp_ms,
        message.key,
        message.raw_value,
        message.headers,
        message.retry,
        message.attempt,
        message.replay,
    )
