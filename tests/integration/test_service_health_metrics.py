"""The two gauges the alert rules watch besides the counters (docs/monitoring.md), from a
real service on a real store: ``redrive_service_ready`` (what /readyz answers) and
``redrive_pending_overdue_seconds`` (how long the oldest due retry has waited past its
due time: it grows while no scheduler runs, and is 0 once a scheduler delivered)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from redrive.clock import now_ms
from redrive.service.service import RetryService
from tests.integration.service_harness import (
    Collector,
    fresh_database,
    pending_count,
    produce,
    request_headers,
    running_service,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.integration


def gauge(service: RetryService, name: str) -> float:
    value = service.metrics.registry.get_sample_value(name)
    assert value is not None, f"{name} is not exposed"
    return value


def test_overdue_grows_without_a_scheduler_and_ready_follows_readyz(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    database = fresh_database(database_url)
    destination = new_topic("overdue")
    # Intake only: the request is stored, and nothing delivers it.
    settings = settings_for(
        bootstrap, database, allowed_destinations=[destination], roles=["intake"]
    )
    with running_service(settings) as intake_only:
        assert gauge(intake_only, "redrive_service_ready") == 1
        assert gauge(intake_only, "redrive_pending_overdue_seconds") == 0  # nothing stored
        due = now_ms() - 30_000  # due half a minute ago
        produce(
            bootstrap,
            settings.requests_topic,
            [{"key": b"k", "value": b"v", "headers": request_headers(destination, due)}],
        )
        wait_until(lambda: pending_count(database) == 1, 20, "the request stored")
        # The gauge is cached for 5 s; a scrape after that reads the store again.
        wait_until(
            lambda: gauge(intake_only, "redrive_pending_overdue_seconds") >= 30,
            10,
            "the oldest due retry reported 30 s overdue",
        )
    # Stopped: not ready (the gauge says what /readyz would).
    assert gauge(intake_only, "redrive_service_ready") == 0
    # A scheduler delivers it; then nothing is overdue.
    collector = Collector(bootstrap, destination)
    try:
        scheduling = settings_for(
            bootstrap,
            database,
            allowed_destinations=[destination],
            requests_topic=settings.requests_topic,
        )
        with running_service(scheduling) as full:
            assert len(collector.poll_until(1, 20)) == 1
            wait_until(lambda: pending_count(database) == 0, 20, "the retry delivered")
            wait_until(
                lambda: gauge(full, "redrive_pending_overdue_seconds") == 0,
                10,
                "nothing overdue once delivered",
            )
            assert gauge(full, "redrive_service_ready") == 1
    finally:
        collector.close()
