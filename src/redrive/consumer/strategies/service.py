"""``service``: non-blocking, through the retry service.

A failed record goes to the service's requests topic with the contract headers; the
service keeps it and delivers it when due to its topic (back to the partition it came
from), or with ``per_group_topic`` to ``<group>.<topic>.retry``, which the App then
reads too, so that other groups reading the topic do not see this group's retries,
and a retry does not wait behind the source's backlog. With ``ordering="key"`` too, a
retry comes back on the per-group topic's partition of the source record's number, so
that the instance holding its key handles it (:mod:`redrive.consumer.co_partitioned`).

``ordering="key"`` comes back on the per-group topic unless told otherwise: a retry
delivered to the end of the source waits behind its backlog, and every later record of
its key read meanwhile has to go through the service behind it.
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
    check_retry_topic,
)
from redrive.errors import ConfigError
from redrive.router import FailedRecord, RetryTarget


@dataclass(frozen=True)
class Service(RetryStrategy):
    """Through the retry service. ``per_group_topic=True``: retries come back on
    ``<group>.<topic>.retry``, read by this group alone (the default with
    ``ordering="key"``; ``False``: back on the source topic); ``ordering="key"``: a
    key's later records wait behind its record waiting for a retry (see
    :mod:`redrive.consumer.held_keys`)."""

    name = "service"
    default_dead_letters = "service"
    key_order = "service"

    per_group_topic: bool | None = None
    """None: True with ``ordering="key"``, False otherwise (set so when made)."""
    ordering: Ordering = None

    def __post_init__(self) -> None:
        check_ordering("Service", self.ordering)
        if self.per_group_topic is None:
            object.__setattr__(self, "per_group_topic", self.ordering == "key")
        elif not isinstance(self.per_group_topic, bool):
            raise ConfigError(
                "Service(per_group_topic=...)", f"{self.per_group_topic!r} is not True or False"
            )

    @property
    def retries_per_group(self) -> bool:
        return self.per_group_topic is True

    def prepare(self, route: RouteView) -> None:
        if self.retries_per_group:
            check_retry_topic(
                route.redelivery_topic,
                "the per-group retry topic",
                "<group>.<topic>.retry",
                "per_group_topic=False",
            )

    def topics(self, route: RouteView) -> dict[str, Kind]:
        return {route.redelivery_topic: "redelivery"} if self.retries_per_group else {}

    def retry_to(
        self, route: RouteView, record: FailedRecord, requests_topic: str
    ) -> RetryTarget | None:
        target = RetryTarget.through(requests_topic, route.redelivery_topic, record)
        if self.ordering is not None and target.destination_partition is None:
            # To the per-group topic's partition of the record's own number, which the
            # instance holding its key reads (consumer/co_partitioned.py).
            return dataclasses.replace(target, destination_partition=record.partition)
        return target
