"""A route's steps through the pipeline, built once when a session opens.

Every record goes decode, repeat filter, tier wait (:mod:`redrive.consumer.pipeline`),
then the route's gates, then its handler, then its outcome
(:mod:`redrive.consumer.outcomes`). The gates are the optional steps: a route has a
key-order gate only with ``ordering="key"`` and a breaker gate only with
``Pause(breaker=...)``, so a route with neither has an empty tuple, which costs the
hot path nothing. A new gate is a function here (or a module) returning a
:data:`Gate`; the sync, async and batch runners all run the same tuple, in the same
order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, final

from redrive.consumer.held_keys import HeldKeys
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


@final
class DealtWith:
    """What a gate returns for a record it dealt with itself (put behind its key)."""


DEALT_WITH: Final = DealtWith()

Gate = Callable[[Message], Wait | DealtWith | None]
"""A step before the handler: None lets the record on; a Wait keeps it (and its
partition) back; DEALT_WITH means it needs its handler no more."""


@dataclass(frozen=True, slots=True)
class Steps:
    """One route's steps: its gates, and what its outcomes report to."""

    route: Route
    gates: tuple[Gate, ...]
    circuit: Circuit | None
    """The route's circuit breaker (``Pause(breaker=...)``): told each outcome."""
    key_order: KeyOrder | None
    """How the route keeps key order (``ordering="key"``): told each hand-off and release."""


def key_order_gate(route: Route, order: KeyOrder) -> Gate:
    goes_behind = order.goes_behind

    def gate(message: Message) -> DealtWith | None:
        return DEALT_WITH if goes_behind(route, message) else None

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

    @classmethod
    def of(
        cls,
        group: str,
        requests_topic: str,
        publisher: Publisher,
        metrics: ConsumerMetrics,
        routes: Iterable[Route],
    ) -> KeyOrders:
        routes = list(routes)
        held = HeldKeys.of(publisher, routes)
        lines = KeyLines.of(publisher, routes)
        return cls(
            ServiceQueues(group, requests_topic, publisher, metrics, held)
            if held.held_topics
            else None,
            TierLines(group, publisher, metrics, lines) if lines.held_topics else None,
        )

    def all(self) -> list[KeyOrder]:
        return [order for order in (self.service, self.tiers) if order is not None]

    def of_route(self, route: Route) -> KeyOrder | None:
        if route.ordering is None:
            return None
        return self.tiers if route.lines_in_tiers else self.service


def build_steps(
    routes: Iterable[Route], orders: KeyOrders, breakers: Breakers
) -> Mapping[str, Steps]:
    """Each route's steps, by route topic."""
    built: dict[str, Steps] = {}
    for route in routes:
        order = orders.of_route(route)
        circuit = breakers.get(route.topic)
        gates: list[Gate] = []
        if order is not None:
            gates.append(key_order_gate(route, order))
        if circuit is not None:
            gates.append(breaker_gate(circuit))
        built[route.topic] = Steps(route, tuple(gates), circuit, order)
    return built
