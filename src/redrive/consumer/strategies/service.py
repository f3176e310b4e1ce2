"""``service``: non-blocking, through the retry service.

A failed record goes to the service's requests topic with the contract headers; the
service keeps it and delivers it when due to its topic (back to the partition it came
from), or with ``per_group_topic`` to ``<group>.<topic>.retry``, which the App then
reads too, so that other groups reading the topic do not see this group's retries,
and a retry does not wait behind the source's backlog. With ``ordering="key"`` too, a
retry comes back on the per-group topic's partition of the source record's number, so
that the instance holding its key handles it (:mod:`redrive.consumer.co_partitioned`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from redrive.consumer.strategies.base import (
    Kind,
    Ordering,
    RetryStrategy,
    RouteView,
    check_ordering,
)
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

    def topics(self, route: RouteView) -> dict[str, Kind]:
        return {route.redelivery_topic: "redelivery"} if self.per_group_topic else {}

    def retry_to(
        self, route: RouteView, record: FailedRecord, requests_topic: str
    ) -> RetryTarget | None:
        target = RetryTarget.through(requests_topic, route.redelivery_topic, record)
        if self.ordering is not None and target.destination_partition is None:
            # To the per-group topic's partition of the record's own number, which the
            # instance holding its key reads (consumer/co_partitioned.py).
            return dataclasses.replace(target, destination_partition=record.partition)
        return target
