"""A route's steps through the pipeline, built once when a session opens.

Every record goes decode, repeat filter, tier wait (:mod:`redrive.consumer.pipeline`),
then the route's gates, then its handler, then its outcome
(:mod:`redrive.consumer.outcomes`). The gates are the optional steps: a route has a
key-order gate only with ``ordering="key"`` and a breaker gate only with
``Pause(breaker=...)``, and a dead-letter brake gate only with
``dead_letter_brake=...`` (:mod:`redrive.consumer.brakes`), so a route with none has
an empty tuple, which costs the hot path nothing. A new gate is a function here (or a
module) returning a :data:`Gate`; the sync, async and batch runners all run the same
tuple, in the same order: key order, the brake, the breaker (a record the brake
admits as its probe goes to its handler unless the breaker holds it).

A gate that returns a Wait must see a partition's records in order, none later
started: true of the sync loop and of async routes kept in partition order, not of
async routes kept in key order, whose later records of a partition may run before an
earlier one's turn. Such a route's brake is its :attr:`Steps.intake_brake` instead,
checked when a record is taken, in partition order (:meth:`AsyncRecords.accept`), and
awaited in its lane at its turn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol, final

from redrive.consumer.bookkeeping import BookkeepingCheck
from redrive.consumer.brakes import Brake, Brakes
from redrive.consumer.held_keys import HeldKeys
from redrive.consumer.kept_lines import KeptLines
from redrive.consumer.key_lines import KeyLines
from redrive.consumer.key_order import KeyOrder
from redrive.consumer.key_order_service import ServiceQueues
from redrive.consumer.key_order_tiers import TierLines
from redrive.consumer.message import Message
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.publisher import Publisher
from redrive.consumer.routes import Route
from redrive.consumer.strategies import Wait
from redrive.consumer.strategies.pause import Breakers, Circuit
from redrive.router import DeadLettered, Retried


@final
class DealtWith:
    """What a gate returns for a record it dealt with itself (put behind its key)."""


DEALT_WITH: Final = DealtWith()

Gate = Callable[[Message], Wait | DealtWith | None]
"""A step before the handler: None lets the record on; a Wait keeps it (and its
partition) back; DEALT_WITH means it needs its handler no more."""


class Watch(Protocol):
    """What hears each outcome of a route's records that reached their handler: the
    pause strategy's :class:`~redrive.consumer.strategies.pause.Circuit`, a
    :class:`~redrive.consumer.brakes.Brake`, or both (:class:`Both`)."""

    def succeeded(self) -> None: ...

    def failed(self, outcome: Retried | DeadLettered, wait: Wait | None) -> Wait | None:
        """A failure was routed; the wait the runner must do (``wait``, or wider)."""
        ...

    def released(self) -> None:
        """The record under way did not finish (redrive's own failure)."""
        ...


@dataclass(frozen=True, slots=True)
class Both:
    """A route with a circuit breaker and a dead-letter brake: both hear everything."""

    first: Watch
    second: Watch

    def succeeded(self) -> None:
        self.first.succeeded()
        self.second.succeeded()

    def failed(self, outcome: Retried | DeadLettered, wait: Wait | None) -> Wait | None:
        return self.second.failed(outcome, self.first.failed(outcome, wait))

    def released(self) -> None:
        self.first.released()
        self.second.released()


@dataclass(frozen=True, slots=True)
class Steps:
    """One route's steps: its gates, and what its outcomes report to."""

    route: Route
    gates: tuple[Gate, ...]
    circuit: Watch | None
    """What hears each outcome: the route's circuit breaker (``Pause(breaker=...)``),
    its dead-letter brake, or both."""
    key_order: KeyOrder | None
    """How the route keeps key order (``ordering="key"``): told each hand-off and release."""
    intake_brake: Brake | None = None
    """An async route kept in key order: its brake, checked as a record is taken (see
    the module; a Wait leaves the record untaken and its partition waiting) and awaited
    at its turn (what was taken before it opened waits in its lane, taken)."""


def key_order_gate(route: Route, order: KeyOrder) -> Gate:
    goes_behind = order.goes_behind

    def gate(message: Message) -> Wait | DealtWith | None:
        behind = goes_behind(route, message)
        if behind is True:
            return DEALT_WITH
        return behind or None

    return gate


def breaker_gate(circuit: Circuit) -> Gate:
    def gate(message: Message) -> Wait | None:
        # Closed: no call. Open or half-open: may this record pass (the probe)?
        return circuit.admit() if circuit.state else None

    return gate


@dataclass(frozen=True, slots=True)
class KeyOrders:
    """The App's two ways of keeping key order, each made only if a route needs it."""

    service: ServiceQueues | None
    tiers: TierLines | None
    kept: KeptLines = field(default_factory=KeptLines)
    """The records both keep behind heads waiting for a short retry."""

    @classmethod
    def of(
        cls,
        group: str,
        requests_topic: str,
        publisher: Publisher,
        metrics: ConsumerMetrics,
        routes: Iterable[Route],
        batched: Iterable[str] = (),
        bookkeeping: BookkeepingCheck | None = None,
    ) -> KeyOrders:
        """``batched``: the topics of batch routes; ``bookkeeping``: what the records read
        back from the held topics must pass (:mod:`redrive.consumer.bookkeeping`)."""
        routes = list(routes)
        held = HeldKeys.of(publisher, routes, bookkeeping)
        lines = KeyLines.of(publisher, routes, bookkeeping)
        batches = set(batched)
        # Records kept behind a key are handled one by one from the sync loop, through
        # the key-order gate alone.
        keeping = {
            r.topic: r
            for r in routes
            if r.ordering is not None
            and not r.is_async
            and r.topic not in batches
            and r.breaker is None
            and r.dead_letter_brake is None
        }
        kept = KeptLines()
        in_service = {t: r for t, r in keeping.items() if t in held.held_topics}
        in_tiers = {t: r for t, r in keeping.items() if t in lines.held_topics}
        return cls(
            ServiceQueues(group, requests_topic, publisher, metrics, held, kept, in_service)
            if held.held_topics
            else None,
            TierLines(group, publisher, metrics, lines, kept, in_tiers)
            if lines.held_topics
            else None,
            kept,
        )

    def send_overdue(self) -> None:
        """Kept lines whose head is not back in time go where it waits."""
        for order in (self.service, self.tiers):
            if order is not None:
                order.send_overdue()

    def all(self) -> list[KeyOrder]:
        return [order for order in (self.service, self.tiers) if order is not None]

    def of_route(self, route: Route) -> KeyOrder | None:
        if route.ordering is None:
            return None
        return self.tiers if route.lines_in_tiers else self.service


def brake_gate(brake: Brake) -> Gate:
    def gate(message: Message) -> Wait | None:
        # Closed: no call. Open: wait; half-open: may this record pass (the probe)?
        return brake.admit(message) if brake.machine.state else None

    return gate


def build_steps(
    routes: Iterable[Route], orders: KeyOrders, breakers: Breakers, brakes: Brakes | None = None
) -> Mapping[str, Steps]:
    """Each route's steps, by route topic."""
    built: dict[str, Steps] = {}
    for route in routes:
        order = orders.of_route(route)
        circuit = breakers.get(route.topic)
        brake = brakes.get(route.topic) if brakes else None
        gates: list[Gate] = []
        intake: Brake | None = None
        if order is not None:
            gates.append(key_order_gate(route, order))
        if brake is not None:
            if route.is_async and not route.strategy.in_place:
                intake = brake
            else:
                gates.append(brake_gate(brake))
        if circuit is not None:
            gates.append(breaker_gate(circuit))
        watch: Watch | None = circuit
        if brake is not None:
            watch = brake if circuit is None else Both(circuit, brake)
        built[route.topic] = Steps(route, tuple(gates), watch, order, intake)
    return built
