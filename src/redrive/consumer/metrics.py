"""Prometheus metrics of a consumer app (in its own registry unless one is given)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ConsumerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.records = Counter(
            "redrive_consumer_records",
            "Records dealt with, by outcome: handled, retried, dead_lettered, "
            "repeat_skipped (a redelivery handled already, or a stale copy), held_behind "
            "(sent behind its key's retry, ordering='key'), held_again (a redelivery "
            "dropped: a record before it in its run failed again, and the retry service "
            "holds it again behind that record), moved_behind (a copy of a "
            "key's line moved behind the record before it: topics strategies), refused "
            "(a record on a retry path whose redrive headers the App cannot believe: "
            "forged, copied, or not signed by its keys; dead-lettered or dropped as "
            "App(returns=...) says, never handled), untrusted_headers (a record on a "
            "source topic with such headers, handled as a new record: counted besides its "
            "outcome), bookkeeping_ignored (a key-order record of the route's held topic "
            "read back and ignored: not signed by the App's keys where it was read).",
            ["topic", "outcome"],
            registry=self.registry,
        )
        # A sum rather than a histogram, timed per batch: observing every record would
        # cost more than a small handler; rate(seconds) / rate(records) gives the mean
        # time per record.
        self.handler_seconds = Counter(
            "redrive_consumer_handler_seconds",
            "Time spent handling records: for def handlers, the handlers and redrive's "
            "work around them, timed per batch; for async def handlers, each call from "
            "its start to its end, awaits included (calls at once overlap).",
            registry=self.registry,
        )
        self.waiting_partitions = Gauge(
            "redrive_consumer_waiting_partitions",
            "Partitions paused until a retry is due.",
            registry=self.registry,
        )
        self.breaker_state = Gauge(
            "redrive_consumer_breaker_state",
            "State of the pause strategy's circuit breaker, by handler topic: "
            "0 closed, 1 open, 2 half-open.",
            ["topic"],
            registry=self.registry,
        )
        self.dead_letter_brake_state = Gauge(
            "redrive_consumer_dead_letter_brake_state",
            "State of each handler's dead-letter brake, by handler topic: 0 closed, "
            "1 open (the route's partitions wait), 2 half-open.",
            ["topic"],
            registry=self.registry,
        )
        self.dead_letter_brake_openings = Counter(
            "redrive_consumer_dead_letter_brake_openings",
            "Times each handler's dead-letter brake opened, by handler topic.",
            ["topic"],
            registry=self.registry,
        )
