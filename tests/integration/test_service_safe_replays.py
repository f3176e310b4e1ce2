"""Replays that cannot make things worse: dry runs change nothing, the loop guard
quarantines a letter that keeps coming back, scheduled jobs start on time; all
audited (docs/api.md, docs/web-ui.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from redrive import App, FatalError
from redrive import Message as RedriveMessage
from redrive.service.service import RetryService
from tests.integration.consumer_harness import a_group, running_app
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
from tests.integration.test_service_replay_jobs import dead_letter_requests, job_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@dataclass
class Env:
    service: RetryService
    api: httpx.Client
    auth: dict[str, str]
    bootstrap: str
    orders: str
    other: str
    """A topic that exists but is not allowed: letters naming it are refused."""


@pytest.fixture
def env(bootstrap: str, database_url: str, new_topic: Callable[..., str]) -> Iterator[Env]:
    orders, other = new_topic("orders", partitions=3), new_topic("other")
    settings = settings_for(bootstrap, fresh_database(database_url), allowed_destinations=[orders])
    with running_service(settings) as service:
        auth = {"Authorization": f"Bearer {service.tokens.create('olivia', 'operator')}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as api:
            yield Env(service, api, auth, bootstrap, orders, other)


def letters_of(env: Env, **query: Any) -> list[dict[str, Any]]:
    response = env.api.get("/api/v1/dead-letters", params={"limit": 500, **query})
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def audit_actions(env: Env) -> list[str]:
    return [a["action"] for a in env.api.get("/api/v1/audit").json()["items"]]


def end_offsets(bootstrap: str, topics: list[str]) -> dict[tuple[str, int], int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "offsets-probe"})
    try:
        found = {}
        for topic in topics:
            partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            for partition in partitions:
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
                found[(topic, partition)] = high
        return found
    finally:
        consumer.close()


def store_snapshot(database_url: str) -> dict[str, Any]:
    """Everything a replay could change in the store (but the audit log)."""
    tables = {
        "dead": "SELECT id, headers, replays, quarantined_at FROM redrive_dead_letters",
        "jobs": "SELECT * FROM redrive_replay_jobs",
        "items": "SELECT * FROM redrive_replay_job_items",
        "pending": "SELECT id FROM redrive_pending",
        "rounds": "SELECT * FROM redrive_replay_rounds",
    }
    with psycopg.connect(database_url) as conn:
        return {
            name: sorted(map(tuple, conn.execute(sql).fetchall())) for name, sql in tables.items()
        }


def test_a_dry_run_says_what_would_go_where_and_changes_nothing(env: Env) -> None:
    requests = dead_letter_requests(env.orders, 12, "d")
    # Two letters whose topic the allowlist refuses, one the loop guard quarantined.
    requests += dead_letter_requests(env.other, 2, "x")
    quarantined = {
        "key": b"q",
        "value": b"q",
        "headers": request_headers(
            env.orders,
            now_ms(),
            send_to="dlq",
            group="orders",
            error_type="orders.Timeout",
            original_topic=env.orders,
            original_partition=0,
            original_offset=999,
            replays=3,
            replay_of=7,
        ),
    }
    produce(env.bootstrap, env.service.settings.requests_topic, [*requests, quarantined])
    wait_until(lambda: len(letters_of(env)) == 15, 30, "15 dead letters")
    by_topic = {(letter["topic"], letter["quarantined"]) for letter in letters_of(env)}
    assert (env.orders, True) in by_topic and (env.orders, False) in by_topic
    db = env.service.database_url
    offsets = end_offsets(env.bootstrap, [env.orders, env.other])
    before = store_snapshot(db)

    everything = {"filter": {"error_type": "orders.Timeout"}, "keep": True}
    many = env.api.post("/api/v1/dead-letters/replay/dry-run", headers=env.auth, json=everything)
    assert many.status_code == 200, many.text
    shown = many.json()
    assert shown["selected"] == 15 and shown["would_send"] == 12
    # Back to the partition each was read from (0): the replay's own placement.
    assert shown["destinations"] == [{"topic": env.orders, "partition": 0, "count": 12}]
    assert len(shown["sample"]) == 5
    first = shown["sample"][0]
    headers = {h["name"]: h["text"] for h in first["headers"]}
    assert headers["trace-id"].startswith("t")
    assert headers["redrive-replays"] == "1"
    assert headers["redrive-replay-of"] == str(first["dead_letter_id"])
    stripped = {h["name"]: h for h in shown["stripped_headers"]}
    assert stripped["redrive-error-type"] == {
        "name": "redrive-error-type",
        "letters": 12,
        "redrive": True,
    }
    assert "trace-id" not in stripped
    assert len(shown["refused"]) == 2
    assert all("not in the allowlist" in r["reason"] for r in shown["refused"])
    [skipped] = shown["skipped"]
    assert skipped["reason"].startswith("quarantined: came back dead after 3 replays")

    letter = shown["sample"][0]["dead_letter_id"]
    edited = {"headers": [{"name": "tenant", "value": {"text": "acme"}}]}
    one = env.api.post(
        f"/api/v1/dead-letters/{letter}/replay/dry-run", headers=env.auth, json=edited
    )
    assert one.status_code == 200, one.text
    single = one.json()
    assert single["would_send"] == 1
    assert [h["name"] for h in single["sample"][0]["headers"]] == [
        "tenant",
        "redrive-replays",
        "redrive-replay-of",
    ]
    # The user's header the edit replaced is stripped too, not as a redrive header.
    assert {"name": "trace-id", "letters": 1, "redrive": False} in single["stripped_headers"]
    by_ids = env.api.post(
        "/api/v1/dead-letters/replay/dry-run", headers=env.auth, json={"ids": [letter, 999_999]}
    ).json()
    assert by_ids["would_send"] == 1
    assert by_ids["refused"] == [{"dead_letter_id": 999_999, "reason": "no dead letter 999999"}]

    # Nothing changed: the store, and the topics a replay would write.
    assert store_snapshot(db) == before
    assert end_offsets(env.bootstrap, [env.orders, env.other]) == offsets
    assert audit_actions(env)[:3] == ["replay-dry-run"] * 3
    entry = env.api.get("/api/v1/audit").json()["items"][2]
    assert entry["detail"]["would_send"] == 12 and entry["detail"]["skipped"] == 1


def test_a_letter_that_comes_back_three_times_is_quarantined_and_jobs_skip_it(
    env: Env, new_topic: Callable[..., str]
) -> None:
    """A real App fails every copy (a fatal error, its dead letters to the service):
    each replay's copy carries its round through the App into its next letter."""

    def refuse(message: RedriveMessage) -> None:
        raise FatalError(f"cannot ship order {message.value!r}")

    app = App(env.bootstrap, group=a_group(), requests_topic=env.service.settings.requests_topic)
    app.add_handler(env.orders, refuse, strategy="service", dead_letters="service")
    produce(env.bootstrap, env.orders, [{"key": b"o-1", "value": b"order-1", "partition": 2}])
    ids = []
    with running_app(app):
        for round_ in range(4):
            wait_until(lambda: len(letters_of(env)) == 1, 60, f"the letter of round {round_}")
            [letter] = letters_of(env)
            assert letter["replays"] == round_ and letter["quarantined"] == (round_ == 3)
            if round_:
                assert letter["replay_of"] == ids[-1]
            ids.append(letter["id"])
            if round_ < 3:
                replayed = env.api.post(
                    f"/api/v1/dead-letters/{letter['id']}/replay", headers=env.auth
                )
                assert replayed.status_code == 200, replayed.text
                # Gone: its copy may come back dead before a look finds none.
                gone = letter["id"]
                wait_until(
                    lambda gone=gone: gone not in {one["id"] for one in letters_of(env)},
                    30,
                    "the replayed letter deleted",
                )
    quarantined = ids[-1]

    # Its story shows each round: replayed when, came back when, as which letter, why.
    rounds = env.api.get(f"/api/v1/dead-letters/{quarantined}/rounds").json()["rounds"]
    assert [(r["round"], r["dead_letter_id"], r["came_back_as"]) for r in rounds] == [
        (1, ids[0], ids[1]),
        (2, ids[1], ids[2]),
        (3, ids[2], ids[3]),
    ]
    assert all(r["error_type"].endswith("FatalError") for r in rounds), rounds
    assert all("cannot ship order" in r["error_message"] for r in rounds), rounds
    assert all(r["replayed_at"] <= r["came_back_at"] for r in rounds)
    stories = env.api.get("/api/v1/records", params={"key": "o-1"}).json()["records"]
    assert [s["rounds"] for s in stories if s["state"] == "dead"] == [rounds]
    # The pages tell the same: the letter's, and its record's story.
    for page in (f"/dead-letters/{quarantined}", "/records?key=o-1"):
        html = env.api.get(page).text
        assert "Replay rounds" in html and f'href="/dead-letters/{ids[1]}"' in html, page
    assert "Came back dead after 3 replays" in env.api.get(f"/dead-letters/{quarantined}").text
    # A replay of its own is refused without the override...
    refused = env.api.post(f"/api/v1/dead-letters/{quarantined}/replay", headers=env.auth)
    assert refused.status_code == 409 and "quarantined" in refused.json()["detail"]
    # ...and a job passes it over, counting it as skipped, with why.
    job = env.api.post(
        "/api/v1/dead-letters/replay",
        headers=env.auth,
        json={"filter": {"topic": env.orders}},
    ).json()["job"]
    assert job["state"] == "done" and job["skipped"] == 1 and job["sent"] == 0
    assert job["failures"][0]["state"] == "skipped"
    assert "quarantined" in job["failures"][0]["error"]
    assert [letter["id"] for letter in letters_of(env)] == [quarantined]
    # The override replays it, and the audit log says so.
    override = {"override_quarantine": True, "keep": True}
    forced = env.api.post(
        f"/api/v1/dead-letters/{quarantined}/replay", headers=env.auth, json=override
    )
    assert forced.status_code == 200, forced.text
    entry = env.api.get("/api/v1/audit").json()["items"][0]
    assert entry["action"] == "replay" and entry["detail"]["override_quarantine"] is True
    assert entry["detail"]["round"] == 4


def _at(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


def test_a_scheduled_job_starts_on_time_and_may_be_cancelled_before(env: Env) -> None:
    produce(
        env.bootstrap,
        env.service.settings.requests_topic,
        dead_letter_requests(env.orders, 6, "s"),
    )
    wait_until(lambda: len(letters_of(env)) == 6, 30, "6 dead letters")
    ids = sorted(letter["id"] for letter in letters_of(env))

    def schedule(letters: list[int], start_at: str) -> dict[str, Any]:
        body = {"ids": letters, "start_at": start_at, "keep": True}
        response = env.api.post("/api/v1/dead-letters/replay", headers=env.auth, json=body)
        assert response.status_code == 202, response.text
        job: dict[str, Any] = response.json()["job"]
        return job

    later = schedule(ids[3:], _at(3600))
    soon = schedule(ids[:3], _at(3))
    assert soon["state"] == "scheduled" and soon["started_at"] is None
    listed = {j["id"]: j for j in env.api.get("/api/v1/jobs").json()["items"]}
    assert listed[later["id"]]["state"] == "scheduled"
    assert listed[later["id"]]["start_at"] == later["start_at"]
    cancelled = env.api.post(f"/api/v1/jobs/{later['id']}/cancel", headers=env.auth)
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert cancelled.json()["cancelled"] == 3 and cancelled.json()["started_at"] is None

    wait_until(lambda: job_of(env.api, soon["id"])["state"] == "done", 30, "the job done")
    done = job_of(env.api, soon["id"])
    assert done["sent"] == 3
    late = datetime.fromisoformat(done["started_at"]) - datetime.fromisoformat(done["start_at"])
    assert timedelta(0) <= late < timedelta(seconds=1), late
    actions = audit_actions(env)
    assert actions.count("schedule-replay-job") == 2 and "cancel-replay-job" in actions


def test_a_scheduled_job_survives_a_restart_of_the_service(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    orders = new_topic("orders")
    settings = settings_for(bootstrap, fresh_database(database_url), allowed_destinations=[orders])
    with running_service(settings) as service:
        produce(bootstrap, settings.requests_topic, dead_letter_requests(orders, 2, "r"))
        wait_until(lambda: len(dead_letters(service.database_url)) == 2, 30, "2 dead letters")
        auth = {"Authorization": f"Bearer {service.tokens.create('olivia', 'operator')}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as api:
            body = {"filter": {"topic": orders}, "start_at": _at(2)}
            response = api.post("/api/v1/dead-letters/replay", headers=auth, json=body)
            assert response.status_code == 202, response.text
            job_id = response.json()["job"]["id"]
    # Stopped before its time: the restarted service starts it.
    with running_service(settings) as service:
        jobs = service.store.replay_jobs
        wait_until(lambda: getattr(jobs.get(job_id), "state", None) == "done", 60, "the job done")
        job = jobs.get(job_id)
        assert job is not None and job.sent == 2
        assert job.started_at is not None and job.start_at is not None
        assert job.started_at >= job.start_at


def test_the_safe_replay_endpoints_refuse_what_they_should(env: Env) -> None:
    produce(
        env.bootstrap,
        env.service.settings.requests_topic,
        dead_letter_requests(env.orders, 1, "r"),
    )
    wait_until(lambda: len(letters_of(env)) == 1, 30, "a dead letter")
    [letter] = letters_of(env)
    dry = f"/api/v1/dead-letters/{letter['id']}/replay/dry-run"
    assert env.api.post(dry).status_code == 401  # an operator's, as the replay
    unknown = env.api.post("/api/v1/dead-letters/424242/replay/dry-run", headers=env.auth)
    assert unknown.status_code == 404
    outside = env.api.post(dry, headers=env.auth, json={"destination": "nowhere"}).json()
    assert outside["would_send"] == 0 and "allowlist" in outside["refused"][0]["reason"]
    seconds = {"ids": [letter["id"]], "start_at": 1_900_000_000}  # ISO 8601 only
    refused = env.api.post("/api/v1/dead-letters/replay", headers=env.auth, json=seconds)
    assert refused.status_code == 422 and "start_at" in refused.json()["detail"]
    far = {"ids": [letter["id"]], "start_at": "2999-01-01T02:00:00Z"}  # a typo in the year
    refused = env.api.post("/api/v1/dead-letters/replay", headers=env.auth, json=far)
    assert refused.status_code == 400 and "days from now" in refused.json()["detail"]
    assert env.api.get("/api/v1/jobs").json()["items"] == []  # a refusal makes no job
    never = env.api.get(f"/api/v1/dead-letters/{letter['id']}/rounds")
    assert never.status_code == 200 and never.json()["rounds"] == []
    done = env.api.post(
        "/api/v1/dead-letters/replay", headers=env.auth, json={"ids": [letter["id"]]}
    ).json()["job"]
    wait_until(lambda: job_of(env.api, done["id"])["state"] == "done", 30, "the job done")
    again = env.api.post(f"/api/v1/jobs/{done['id']}/cancel", headers=env.auth)
    assert again.status_code == 409
