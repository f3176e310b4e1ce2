"""``pause``: retried in place behind a circuit breaker.

A failed record is retried in place, like ``blocking``: it is sought back and its
partition waits until the retry is due; the other partitions flow. Each handler's
:class:`~redrive.consumer.breaker.Breaker` counts the failures: when they reach its
threshold within its window it opens, and every assigned partition waits (sought back
and paused through :class:`~redrive.consumer.pauses.PauseBook`, no sleep) for its open
time; then one record passes (half-open): its success closes the breaker, its failure
reopens it for the next, longer open time. For applications where every record would
fail the same way (a database down).

What counts: a failure the policy judged retryable (retried, or dead-lettered because
its attempts or its deadline ran out). A fatal error (the record's own fault, straight
to the dead letters), a record that cannot be read or deserialized, and redrive's own
failures do not count, and do not end a half-open breaker's probe.

:class:`Breakers` is the App's side of the breakers (one :class:`Circuit` per pause
handler): it drives each :class:`~redrive.consumer.breaker.BreakerMachine` with the
clock, and reports each transition in the logs, the
``redrive_consumer_breaker_state`` gauge and the App's ``on_breaker`` hook.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog

from redrive.clock import Clock, now_ms
from redrive.consumer.breaker import Breaker, BreakerMachine, BreakerState, Transition
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.strategies.base import RetryStrategy, RouteView, Wait
from redrive.errors import ConfigError
from redrive.policy import Retry
from redrive.reasons import DeadLetterReason
from redrive.router import DeadLettered, FailedRecord, Retried, RetryTarget

log = structlog.get_logger("redrive.consumer")

BreakerHook = Callable[[str, BreakerState, BreakerState], None]
"""``on_breaker(topic, old_state, new_state)``, called on each transition."""

DEFAULT_BREAKER = Breaker()
"""A pause handler's breaker unless it names one: 5 failures in 30 s open it, for 5 s,
then 10 s, 20 s... at most 5 m while its probes fail."""


@dataclass(frozen=True)
class Pause(RetryStrategy):
    """Retried in place, the partition paused until the retry is due, and every
    partition while ``breaker`` is open (default: :data:`DEFAULT_BREAKER`)."""

    name = "pause"
    in_place = True

    breaker: Breaker = DEFAULT_BREAKER

    def __post_init__(self) -> None:
        if not isinstance(self.breaker, Breaker):
            raise ConfigError(
                "Pause(breaker=...)",
                f"{self.breaker!r} is not a Breaker",
                'use Pause(breaker=Breaker(failures=5, window="30s", open_for="5s"))',
            )

    def retry_to(
        self, route: RouteView, record: FailedRecord, requests_topic: str
    ) -> RetryTarget | None:
        return None

    def wait(self, retry: Retry) -> Wait:
        # The record's own partition; the breaker (Circuit.failed) widens it to all.
        return Wait(retry.at_ms)


class Circuit:
    """One pause handler's breaker in a running App (see the module)."""

    def __init__(
        self,
        topic: str,
        settings: Breaker,
        metrics: ConsumerMetrics,
        hook: BreakerHook | None,
        clock: Clock = now_ms,
        rng: random.Random | None = None,
    ) -> None:
        self.topic = topic
        self.machine = BreakerMachine(settings, rng)
        self.hook = hook
        self.clock = clock
        self.now = clock()
        """The time of the loop's current turn (successes are counted at it)."""
        self.metrics = metrics
        self._gauge = metrics.breaker_state.labels(topic)
        self._gauge.set(BreakerState.CLOSED)

    @property
    def state(self) -> BreakerState:
        return self.machine.state

    def tick(self, now: int) -> None:
        self.now = now
        self._report(self.machine.tick(now))

    def admit(self) -> Wait | None:
        """None: the record may reach its handler (closed, or the half-open probe);
        else the wait that keeps it, and every partition, back."""
        machine = self.machine
        if machine.admit(self.now):
            return None
        until = machine.open_until_ms if machine.state is BreakerState.OPEN else None
        until = self.now if until is None else until
        return Wait(until, all_partitions=True)

    def succeeded(self) -> None:
        if self.machine.state is BreakerState.CLOSED and self.machine.settings.ratio is None:
            return  # the hot path: nothing to count
        self._report(self.machine.success(self.now))

    def failed(self, outcome: Retried | DeadLettered, wait: Wait | None) -> Wait | None:
        """A handler failure was routed (``wait``: the record's own, None when it was
        dead-lettered); the wait the loop must do, widened to every partition when
        the failure opened the breaker."""
        machine = self.machine
        now = self.clock()
        if isinstance(outcome, DeadLettered) and not counts(outcome):
            machine.ignored(now)
            return wait
        transition = machine.failure(now)
        self._report(transition)
        if transition is None or transition.open_until_ms is None:
            return wait
        until = transition.open_until_ms
        if wait is None:
            return Wait(until, all_partitions=True, dealt_with=True)
        return Wait(max(wait.until_ms, until), all_partitions=True, all_until_ms=until)

    def released(self) -> None:
        """The record under way did not finish (redrive's own failure): not a probe."""
        self.machine.ignored(self.now)

    def _report(self, transition: Transition | None) -> None:
        if transition is None:
            return
        new = transition.new
        self._gauge.set(new)
        level = logging.WARNING if new is BreakerState.OPEN else logging.INFO
        fields: dict[str, object] = {}
        if transition.open_until_ms is not None:
            fields["open_until_ms"] = transition.open_until_ms
        log.log(
            level,
            "circuit breaker " + new.name.lower().replace("_", "-"),
            topic=self.topic,
            state=new.name.lower(),
            previous=transition.old.name.lower(),
            why=transition.why,
            **fields,
        )
        if self.hook is not None:
            try:
                self.hook(self.topic, transition.old, new)
            except Exception:
                log.exception("hook failed", hook=getattr(self.hook, "__name__", repr(self.hook)))


def counts(outcome: DeadLettered) -> bool:
    """Whether a dead-lettered failure counts against the breaker: one the policy judged
    retryable (attempts or deadline ran out), not a fatal error."""
    return outcome.decision.reason in (
        DeadLetterReason.ATTEMPTS_EXHAUSTED,
        DeadLetterReason.DEADLINE_PASSED,
    )


class Breakers:
    """The circuits of one App, by handler topic (none when no handler pauses)."""

    def __init__(self, circuits: Iterable[Circuit] = ()) -> None:
        self.by_topic: dict[str, Circuit] = {c.topic: c for c in circuits}

    @classmethod
    def of(
        cls,
        routes: Iterable[tuple[str, Breaker | None]],
        metrics: ConsumerMetrics,
        hook: BreakerHook | None,
    ) -> Breakers:
        """A circuit for each (topic, breaker) that has a breaker."""
        return cls(
            Circuit(topic, settings, metrics, hook, rng=random.Random())  # noqa: S311
            for topic, settings in routes
            if settings is not None
        )

    def tick(self, now: int) -> None:
        """The loop's turn: open breakers whose time is over become half-open."""
        for circuit in self.by_topic.values():
            circuit.tick(now)

    def get(self, topic: str) -> Circuit | None:
        return self.by_topic.get(topic) if self.by_topic else None

    def __bool__(self) -> bool:
        return bool(self.by_topic)
