"""``service``: non-blocking, through the retry service.

A failed record goes to the service's requests topic with the contract headers; the
service keeps it and delivers it when due to its topic (back to the partition it came
from), or with ``per_group_topic`` to ``<group>.<topic>.retry``, which the App then
reads too, so that other groups reading the topic do not see this group's retries.
"""

from __future__ import annotations

from redrive.consumer.strategies.base import Kind, RetryStrategy, Route
from redrive.router import FailedRecord, RetryTarget


class Service(RetryStrategy):
    name = "service"
    default_dead_letters = "service"
    per_group_topic = True
    key_order = "service"

    def topics(self, route: Route) -> dict[str, Kind]:
        return {route.redelivery_topic: "redelivery"} if route.per_group_topic else {}

    def retry_to(
        self, route: Route, record: FailedRecord, requests_topic: str
    ) -> RetryTarget | None:
        return RetryTarget.through(requests_topic, route.redelivery_topic, record)
