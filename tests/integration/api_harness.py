"""The API tests' service: one on a fresh database per test, with seven dead letters
(six consumers' dead letters of two error types, one refused request), and tokens."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest

from redrive.service.service import RetryService
from tests.integration.service_harness import (
    dead_letters,
    fresh_database,
    now_ms,
    produce,
    request_headers,
    running_service,
    settings_for,
    wait_until,
)


@dataclass
class Env:
    service: RetryService
    api: httpx.Client
    topic: str
    other: str
    outside: str
    operator: dict[str, str]
    viewer: dict[str, str]
    bootstrap: str


def consumer_dead_letter(
    topic: str, error_type: str, message: str, original_offset: int = 5
) -> list[tuple[str, bytes | None]]:
    """A consumer's dead letter of the record at ``original_offset`` (each record's
    failure is one: the same one sent again is dropped as a repeat)."""
    return request_headers(
        topic,
        now_ms(),
        user_headers=[("trace-id", b"abc")],
        send_to="dlq",
        attempt=3,
        group="billing",
        error_type=error_type,
        error_message=message,
        original_topic=topic,
        original_partition=0,
        original_offset=original_offset,
        reason="attempts exhausted (3 of 3)",
    )


@pytest.fixture
def env(bootstrap: str, database_url: str, new_topic: Callable[..., str]) -> Iterator[Env]:
    topic, other, outside = new_topic("api"), new_topic("api-other"), new_topic("api-outside")
    settings = settings_for(
        bootstrap,
        fresh_database(database_url),
        allowed_destinations=[topic, other],
        replay_rate_per_second=2000,
    )
    with running_service(settings) as service:
        records = [
            {
                "key": f"k{i}".encode(),
                "value": f'{{"n": {i}}}'.encode(),
                "headers": consumer_dead_letter(
                    topic, "billing.Timeout" if i % 2 else "billing.Bad", f"gateway said {i}", i
                ),
            }
            for i in range(6)
        ]
        records.append({"key": b"bad", "value": b"\x00\xff", "headers": [("x", b"y")]})
        produce(bootstrap, settings.requests_topic, records)
        wait_until(lambda: len(dead_letters(service.database_url)) >= 7, 20, "the 7 dead letters")
        operator = {"Authorization": f"Bearer {service.tokens.create('olivia', 'operator')}"}
        viewer = {"Authorization": f"Bearer {service.tokens.create('victor', 'viewer')}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as api:
            yield Env(service, api, topic, other, outside, operator, viewer, bootstrap)


def ids_of(env: Env, **params: str) -> list[int]:
    response = env.api.get("/api/v1/dead-letters", params=params)
    assert response.status_code == 200, response.text
    return [item["id"] for item in response.json()["items"]]
