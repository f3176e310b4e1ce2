"""The App's side of the dead-letter brakes (``dead_letter_brake=DeadLetterBrake(...)``).

One :class:`Brake` per route that has one: it drives the route's
:class:`~redrive.consumer.brake.BrakeMachine` with the clock, hears every outcome of
the route's records (as the pause strategy's circuit does: ``succeeded``, ``failed``,
``released``), and is the route's last gate: while it is open, a record of the route
that reaches it waits, its partition sought back to it and paused until the open time
is over (:class:`~redrive.consumer.pauses.PauseBook`, no sleep), so that each
partition of the route (its source, its tiers, its per-group topic) stops at its first
record and nothing is skipped or lost: the records are read again once it half-opens.
Half-open, one record passes (the probe); the others wait :data:`PROBE_RECHECK_MS`
and try again. Other routes of the App flow on.

Each transition is logged (``dead-letter brake open`` as a warning, naming the route's
topic and the rate that opened it), sets the gauge
``redrive_consumer_dead_letter_brake_state{topic}`` (0 closed, 1 open, 2 half-open),
counts ``redrive_consumer_dead_letter_brake_openings_total{topic}``, and shows in
``/healthz`` (:meth:`Brakes.degrade`: 200, ``"status": "degraded"``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable

import structlog

from redrive.clock import Clock, now_ms
from redrive.consumer.brake import BrakeMachine, BreakerState, DeadLetterBrake, Transition
from redrive.consumer.message import Message
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.metrics_server import Health
from redrive.consumer.routes import Route
from redrive.consumer.strategies import Wait
from redrive.router import DeadLettered, Retried

log = structlog.get_logger("redrive.consumer")

PROBE_RECHECK_MS = 200
"""While a half-open brake's probe is out, how long the route's other records wait
before they try again (the probe's success lets them all on)."""


class Brake:
    """One route's dead-letter brake in a running App (see the module)."""

    def __init__(
        self,
        route: Route,
        settings: DeadLetterBrake,
        metrics: ConsumerMetrics,
        clock: Clock = now_ms,
        rng: random.Random | None = None,
    ) -> None:
        self.topic = route.topic
        self.reads = sorted(route.topics())
        """Every topic the brake holds (the route's source, tiers, per-group topic)."""
        self.machine = BrakeMachine(settings, rng)
        self.clock = clock
        self._gauge = metrics.dead_letter_brake_state.labels(self.topic)
        self._gauge.set(BreakerState.CLOSED)
        self._openings = metrics.dead_letter_brake_openings.labels(self.topic)

    @property
    def state(self) -> BreakerState:
        return self.machine.state

    def tick(self, now: int) -> None:
        self._report(self.machine.tick(now))

    def admit(self, message: Message) -> Wait | None:
        """The gate: None lets the record reach its handler (closed, or the probe);
        else the wait that holds it, and its partition, back."""
        machine = self.machine
        now = self.clock()
        self._report(machine.tick(now))
        if machine.admit(now):
            return None
        if machine.state is BreakerState.OPEN and machine.open_until_ms is not None:
            return Wait(machine.open_until_ms)
        return Wait(now + PROBE_RECHECK_MS)

    # The route's outcomes (the pause strategy's Circuit hears them the same way).

    def succeeded(self) -> None:
        if self.machine.state is not BreakerState.CLOSED:
            self._report(self.machine.handled(self.clock()))

    def failed(self, outcome: Retried | DeadLettered, wait: Wait | None) -> Wait | None:
        """A handler failure was routed: a dead letter counts; the wait is the route's
        own, unchanged (the brake holds records at its gate, not here)."""
        if isinstance(outcome, DeadLettered):
            self._report(self.machine.dead_lettered(self.clock()))
        elif self.machine.state is not BreakerState.CLOSED:
            self._report(self.machine.retried(self.clock()))
        return wait

    def released(self) -> None:
        """A record did not finish (redrive's own failure): no probe's outcome; the
        probe timeout lets another go."""

    def health(self) -> dict[str, object]:
        machine = self.machine
        detail: dict[str, object] = {"state": machine.state.name.lower().replace("_", "-")}
        if machine.state is BreakerState.OPEN:
            detail["open_until_ms"] = machine.open_until_ms
        return detail

    def _report(self, transition: Transition | None) -> None:
        if transition is None:
            return
        new = transition.new
        self._gauge.set(new)
        fields: dict[str, object] = {}
        level = logging.INFO
        if new is BreakerState.OPEN:
            self._openings.inc()
            level = logging.WARNING
            fields = {"open_until_ms": transition.open_until_ms, "holds": self.reads}
        log.log(
            level,
            "dead-letter brake " + new.name.lower().replace("_", "-"),
            topic=self.topic,
            state=new.name.lower(),
            previous=transition.old.name.lower(),
            why=transition.why,
            brake=str(self.machine.settings),
            **fields,
        )


class Brakes:
    """The brakes of one App, by route topic (none when no route has one)."""

    def __init__(self, brakes: Iterable[Brake] = ()) -> None:
        self.by_topic: dict[str, Brake] = {b.topic: b for b in brakes}

    @classmethod
    def of(cls, routes: Iterable[Route], metrics: ConsumerMetrics) -> Brakes:
        """A brake for each route that has one."""
        return cls(
            Brake(route, route.dead_letter_brake, metrics, rng=random.Random())  # noqa: S311
            for route in routes
            if route.dead_letter_brake is not None
        )

    def tick(self, now: int) -> None:
        """The loop's turn: open brakes whose time is over become half-open."""
        for brake in self.by_topic.values():
            if brake.state is BreakerState.OPEN:
                brake.tick(now)

    def get(self, topic: str) -> Brake | None:
        return self.by_topic.get(topic) if self.by_topic else None

    def degrade(self, verdict: Health) -> Health:
        """``/healthz`` with the brakes: a healthy App with a brake not closed is alive
        but ``degraded`` (still 200: restarting it would not bring the downstream
        back, and would read the held records again)."""
        if not self.by_topic or not verdict.ok:
            return verdict
        brakes = {topic: brake.health() for topic, brake in self.by_topic.items()}
        detail = {**verdict.detail, "dead_letter_brakes": brakes}
        if any(brake.state is not BreakerState.CLOSED for brake in self.by_topic.values()):
            detail["status"] = "degraded"
        return Health(True, detail)

    def __bool__(self) -> bool:
        return bool(self.by_topic)
