"""Prometheus metrics of a consumer app (in its own registry unless one is given)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ConsumerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.records = Counter(
            "redrive_consumer_records",
            "Records dealt with, by outcome: handled, retried, dead_lettered.",
            ["topic", "outcome"],
            registry=self.registry,
        )
        self.handler_seconds = Histogram(
            "redrive_consumer_handler_seconds",
            "Time spent in handlers.",
            registry=self.registry,
        )
        self.waiting_partitions = Gauge(
            "redrive_consumer_waiting_partitions",
            "Partitions paused until a retry is due.",
            registry=self.registry,
        )
