"""A share app's metrics: a consumer's (:class:`ConsumerMetrics`), and how its
records were acknowledged and kept within their acquisition locks."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from redrive.consumer.metrics import ConsumerMetrics


class ShareMetrics(ConsumerMetrics):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self.acknowledgements = Counter(
            "redrive_share_acknowledgements",
            "Records of a share group acknowledged, by type: accept (handled, handed "
            "off, or dealt with before the handler), release (delivered again at "
            "once: a retry due now, or a record not started before its lock ran out), "
            "reject (dead-lettered).",
            ["topic", "type"],
            registry=self.registry,
        )
        self.lock_released = Counter(
            "redrive_share_lock_released",
            "Records released unhandled because their acquisition lock was about to run "
            "out: not started, or an async handler cancelled.",
            ["topic"],
            registry=self.registry,
        )
        self.lock_outlived = Counter(
            "redrive_share_lock_outlived",
            "Records whose handler ended after their acquisition lock ran out (the "
            "broker may have delivered them to another consumer meanwhile).",
            ["topic"],
            registry=self.registry,
        )
