"""The retry service's delivery producer, replaced once it has failed for good.

An idempotent producer with a fatal error fails every record it is given from then
on; the scheduler keeps the rows it failed due (they are tried again soon), and
without a new producer they would fail for ever. No broker is needed: a producer
connects when it first sends, and the decision is made on the errors it reported.
"""

from __future__ import annotations

import threading
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError

from redrive.service.config import ServiceSettings
from redrive.service.metrics import ServiceMetrics
from redrive.service.scheduler import Scheduler, _Outcome

pytestmark = pytest.mark.unit

NO_ROW = cast(Any, None)  # the decision reads the errors only


def scheduler() -> Scheduler:
    metrics = ServiceMetrics(pending_by_destination=dict)
    config = {"bootstrap.servers": "127.0.0.1:9"}
    return Scheduler(ServiceSettings(), config, cast(Any, None), metrics, threading.Event())


def replaced(made: Scheduler) -> float:
    sample = made.metrics.registry.get_sample_value(
        "redrive_delivery_errors_total", {"error": "producer_replaced"}
    )
    return sample or 0.0


@pytest.mark.parametrize(
    "error",
    [
        KafkaError(KafkaError._FATAL, "fatal idempotent producer error", fatal=True),
        KafkaError(KafkaError._FATAL, "produce() after a fatal error"),
    ],
)
def test_a_producer_that_failed_for_good_is_replaced(error: KafkaError) -> None:
    made = scheduler()
    first = made.producer
    try:
        made._replace_if_fatal(_Outcome(transient=[(NO_ROW, None), (NO_ROW, error)]))
        assert made.producer is not first
        assert replaced(made) == 1
    finally:
        made.producer.close()


@pytest.mark.parametrize(
    "error",
    [None, KafkaError(KafkaError._MSG_TIMED_OUT), KafkaError(KafkaError._TRANSPORT)],
)
def test_a_passing_failure_keeps_the_producer(error: KafkaError | None) -> None:
    made = scheduler()
    first = made.producer
    try:
        made._replace_if_fatal(_Outcome(transient=[(NO_ROW, error)]))
        assert made.producer is first
        assert replaced(made) == 0
    finally:
        made.producer.close()
