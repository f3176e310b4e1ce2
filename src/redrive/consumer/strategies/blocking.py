"""``blocking``: stateful retry in place, order kept.

The failed record is sought back and its partition paused until the retry is due;
other partitions flow, and the loop keeps polling (no sleep, no rebalance, no
duplicates). Nothing is written until the policy gives up.
"""

from __future__ import annotations

from dataclasses import dataclass

from redrive.consumer.strategies.base import RetryStrategy, RouteView, Wait
from redrive.policy import Retry
from redrive.router import FailedRecord, RetryTarget


@dataclass(frozen=True)
class Blocking(RetryStrategy):
    """Retried in place, the partition paused until the retry is due (no options:
    the whole partition's order is kept)."""

    name = "blocking"
    in_place = True

    def retry_to(
        self, route: RouteView, record: FailedRecord, requests_topic: str
    ) -> RetryTarget | None:
        return None

    def wait(self, retry: Retry) -> Wait:
        return Wait(retry.at_ms)
