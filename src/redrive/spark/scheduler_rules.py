"""What the Spark scheduler checks each request against, on the executors.

The rules are built and checked on the driver, then shipped to the executors with
the query: the destination allowlist and delay limit of ``redrive serve``, and topic
metadata from one admin client per Python worker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from redrive.client_logs import with_client_logs
from redrive.destinations import DestinationAllowlist, check_patterns
from redrive.errors import ConfigError
from redrive.headers import is_topic_name
from redrive.requests import IntakeRules

METADATA_WAIT_S: Final = 120.0
"""How long a batch waits for the broker to answer topic metadata before failing."""


@dataclass(frozen=True)
class SchedulerRules:
    """What the scheduler checks requests against; shipped to the executors.

    Checked as ``redrive serve`` checks its settings of the same names
    (:meth:`checked`), and matched with the same allowlist, so that a pattern means
    exactly what it means to the service.
    """

    requests_topic: str
    dlq_topic: str
    allowed_destinations: tuple[str, ...]
    max_delay_ms: int
    admin_config: tuple[tuple[str, str], ...]
    """librdkafka settings of the client that looks up topic metadata."""

    @classmethod
    def checked(
        cls,
        *,
        requests_topic: str,
        dlq_topic: str,
        allowed_destinations: Sequence[str],
        max_delay_days: float,
        admin_config: Mapping[str, str],
    ) -> SchedulerRules:
        """The rules, or a ConfigError naming the first argument that is wrong."""
        for name, topic in (("requests_topic", requests_topic), ("dlq_topic", dlq_topic)):
            if not is_topic_name(topic):
                raise ConfigError(name, f"{topic!r} is not a legal Kafka topic name")
        try:
            check_patterns(allowed_destinations)
        except ValueError as exc:
            raise ConfigError("allowed_destinations", str(exc)) from None
        if not max_delay_days > 0:
            raise ConfigError("max_delay_days", f"must be greater than 0, got {max_delay_days}")
        return cls(
            requests_topic=requests_topic,
            dlq_topic=dlq_topic,
            allowed_destinations=tuple(allowed_destinations),
            max_delay_ms=int(max_delay_days * 86_400_000),
            admin_config=tuple(sorted(admin_config.items())),
        )

    def intake_rules(self) -> IntakeRules:
        """The rules for :func:`classify`: the service's allowlist and topic metadata
        from this worker's cache."""
        allowlist = DestinationAllowlist(self.allowed_destinations, self.requests_topic)
        return IntakeRules(
            destination_allowed=allowlist.allows,
            partitions_of=_partitions_lookup(self.admin_config),
            max_delay_ms=self.max_delay_ms,
        )


_lookups: dict[tuple[tuple[str, str], ...], Callable[[str], int | None]] = {}
_lookups_lock = threading.Lock()


def _partitions_lookup(config: tuple[tuple[str, str], ...]) -> Callable[[str], int | None]:
    """Partition counts of topics, cached per Python worker (one admin client each).

    While the broker cannot answer, waits up to :data:`METADATA_WAIT_S`, then raises
    MetadataUnavailable, which fails the batch: the query stops, and a restart reads
    the same requests again. Nothing is dead-lettered for a broker outage.
    """
    with _lookups_lock:
        lookup = _lookups.get(config)
        if lookup is None:
            from confluent_kafka.admin import AdminClient

            from redrive.topic_admin import MetadataUnavailable, TopicMetadata

            metadata = TopicMetadata(AdminClient(with_client_logs(dict(config))))

            def partitions_of(topic: str) -> int | None:
                deadline = time.monotonic() + METADATA_WAIT_S
                delay = 0.2
                while True:
                    try:
                        return metadata.partitions_of(topic)
                    except MetadataUnavailable:
                        if time.monotonic() + delay > deadline:
                            raise
                        time.sleep(delay)
                        delay = min(delay * 2, 5.0)

            lookup = _lookups[config] = partitions_of
        return lookup
