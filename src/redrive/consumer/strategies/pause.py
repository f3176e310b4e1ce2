"""``pause``: a circuit breaker.

On a retryable failure every assigned partition waits until the retry is due, then
the consumer resumes from the failed record: for linear applications where every
record would fail the same way (a database down). Retried in place, like blocking.
"""

from __future__ import annotations

from redrive.consumer.strategies.base import RetryStrategy, Route, Wait
from redrive.policy import Retry
from redrive.router import FailedRecord, RetryTarget


class Pause(RetryStrategy):
    name = "pause"

    def retry_to(
        self, route: Route, record: FailedRecord, requests_topic: str
    ) -> RetryTarget | None:
        return None

    def wait(self, retry: Retry) -> Wait:
        return Wait(retry.at_ms, all_partitions=True)
