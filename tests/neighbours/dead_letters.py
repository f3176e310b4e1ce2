"""The retry service side of a neighbour's run: its dead-letter topics ingested, each
letter looked up in the API and the UI, and replayed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from redrive.deadlines import Deadline
from redrive.service.service import RetryService
from tests.integration.service_harness import fresh_database, running_service, settings_for


@dataclass
class Letters:
    """A running service that ingests dead-letter topics, through its API."""

    service: RetryService
    api: httpx.Client
    operator: dict[str, str]

    def listed(self, **params: str) -> list[dict[str, Any]]:
        response = self.api.get("/api/v1/dead-letters", params=params)
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    def wait(self, count: int, timeout_s: float = 60, **params: str) -> list[dict[str, Any]]:
        """The letters ``params`` find, once there are ``count``: each letter's detail."""
        deadline = Deadline(timeout_s)
        while len(items := self.listed(**params)) < count:
            assert not deadline.passed(), f"{len(items)} of {count} letters ({params})"
            time.sleep(0.2)
        return [self.detail(item["id"]) for item in items]

    def wait_for(
        self, where: Callable[[dict[str, Any]], bool], timeout_s: float = 60, **params: str
    ) -> dict[str, Any]:
        """The first letter ``params`` find that ``where`` accepts, once there is one."""
        deadline = Deadline(timeout_s)
        while True:
            for item in self.listed(**params):
                if where(detail := self.detail(item["id"])):
                    return detail
            assert not deadline.passed(), f"no such letter ({params})"
            time.sleep(0.2)

    def detail(self, letter_id: int) -> dict[str, Any]:
        response = self.api.get(f"/api/v1/dead-letters/{letter_id}")
        assert response.status_code == 200, response.text
        found: dict[str, Any] = response.json()
        return found

    def page(self, letter_id: int) -> str:
        """The letter's page in the web UI."""
        response = self.api.get(f"/dead-letters/{letter_id}")
        assert response.status_code == 200, response.text
        return response.text

    def replay(self, letter_id: int, destination: str | None = None) -> None:
        body = {"destination": destination} if destination else None
        response = self.api.post(
            f"/api/v1/dead-letters/{letter_id}/replay", headers=self.operator, json=body
        )
        assert response.status_code == 200, response.text
        assert response.json()["replayed"] == 1, response.text


@contextmanager
def ingesting(
    bootstrap: str, database_url: str, topics: list[str], allowed: list[str]
) -> Iterator[Letters]:
    """A service on a fresh database ingesting ``topics`` (format auto), allowed to
    replay to ``allowed``."""
    settings = settings_for(
        bootstrap,
        fresh_database(database_url),
        allowed_destinations=allowed,
        ingest=[{"topic": topic, "format": "auto"} for topic in topics],
    )
    with running_service(settings) as service:
        operator = {"Authorization": f"Bearer {service.tokens.create('olivia', 'operator')}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as api:
            yield Letters(service, api, operator)
