"""``service``: non-blocking, through the retry service.

A failed record goes to the service's requests topic with the contract headers; the
service keeps it and delivers it when due to its topic (back to the partition it came
from), or with ``per_group_topic`` to ``<group>.<topic>.retry``, which the App then
reads too, so that other groups reading the topic do not see this group's retries.
"""

from __future__ import annotations

from dataclasses import dataclass

from redrive.consumer.strategies.base import Kind, Ordering, RetryStrategy, Route, check_ordering
from redrive.errors import ConfigError
from redrive.router import FailedRecord, RetryTarget


@dataclass(frozen=True)
class Service(RetryStrategy):
    """Through the retry service. ``per_group_topic=True``: retries come back on
    ``<group>.<topic>.retry``, read by this group alone; ``ordering="key"``: a key's
    later records wait behind its record waiting for a retry (see
    :mod:`redrive.consumer.held_keys`)."""

    name = "service"
    default_dead_letters = "service"
    key_order = "service"

    per_group_topic: bool = False
    ordering: Ordering = None

    def __post_init__(self) -> None:
        check_ordering("Service", self.ordering)
        if not isinstance(self.per_group_topic, bool):
            raise ConfigError(
                "Service(per_group_topic=...)", f"{self.per_group_topic!r} is not True or False"
            )
        if self.ordering is not None and self.per_group_topic:
            raise ConfigError(
                "Service(ordering=..., per_group_topic=...)",
                "key order needs the retries delivered back to their own partition",
                "drop per_group_topic=True",
            )

    def topics(self, route: Route) -> dict[str, Kind]:
        return {route.redelivery_topic: "redelivery"} if self.per_group_topic else {}

    def retry_to(
        self, route: Route, record: FailedRecord, requests_topic: str
    ) -> RetryTarget | None:
        return RetryTarget.through(requests_topic, route.redelivery_topic, record)
