"""Bulk replays run as background jobs: paced, visible while they run, resumed after
the service is killed, each dead letter sent exactly once, one job per letter.

The pace itself (5,000 letters at 500/s take 10 s) is measured by the benchmarks
(`python -m bench service`), not asserted here.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer

from redrive.ports import free_port
from redrive.service.auth import Tokens
from redrive.service.store import Placed, Store
from tests.integration.consumer_harness import wait_for
from tests.integration.service_harness import (
    Collector,
    ServiceProcess,
    dead_letters,
    fresh_database,
    now_ms,
    produce,
    request_headers,
    running_service,
    settings_for,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

LETTERS = 5_000
RATE = 500


def dead_letter_requests(destination: str, count: int, tag: str) -> list[dict[str, Any]]:
    """Requests a consumer sends when it gives up: each becomes one dead letter."""
    return [
        {
            "key": f"k{i % 97}".encode(),
            "value": f"{tag}-{i:05d}".encode(),
            "headers": request_headers(
                destination,
                now_ms(),
                user_headers=[("trace-id", f"t{i}".encode())],
                send_to="dlq",
                attempt=3,
                group="orders",
                error_type="orders.Timeout",
                error_message=f"gateway timed out on {i}",
                original_topic=destination,
                original_partition=0,
                original_offset=i,
                reason="attempts exhausted (3 of 3)",
            ),
        }
        for i in range(count)
    ]


def operator_token(database_url: str) -> dict[str, str]:
    store = Store(database_url)
    store.open()
    try:
        return {"Authorization": f"Bearer {Tokens(store).create('olivia', 'operator')}"}
    finally:
        store.close()


def job_of(api: httpx.Client, job_id: int) -> dict[str, Any]:
    response = api.get(f"/api/v1/jobs/{job_id}")
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


def sent_or_cancelled(job: dict[str, Any]) -> int:
    """How many of a job's letters are sent or cancelled, for good."""
    return int(job["sent"]) + int(job["cancelled"])


def audit_actions(api: httpx.Client) -> list[str]:
    """The audit log's actions, newest first."""
    return [a["action"] for a in api.get("/api/v1/audit").json()["items"]]


def replay_all(api: httpx.Client, auth: dict[str, str], **body: Any) -> httpx.Response:
    return api.post(
        "/api/v1/dead-letters/replay",
        headers=auth,
        json={"filter": {"error_type": "orders.Timeout"}, **body},
    )


def test_a_job_of_5000_survives_a_sigkill_and_sends_each_letter_once(
    bootstrap: str, database_url: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    destination = new_topic("replayed", partitions=3)
    db = fresh_database(database_url)
    settings = settings_for(
        bootstrap, db, allowed_destinations=[destination], http_port=free_port()
    )
    service = ServiceProcess(settings, tmp_path / "serve.log")
    service.start()
    collector = Collector(bootstrap, destination)  # reads committed records only
    api = httpx.Client(base_url=f"http://127.0.0.1:{settings.http_port}", timeout=30)
    try:
        produce(bootstrap, settings.requests_topic, dead_letter_requests(destination, LETTERS, "v"))
        wait_until(lambda: len(dead_letters(db)) == LETTERS, 60, "5,000 dead letters")
        auth = operator_token(db)

        started = replay_all(api, auth, rate=RATE)
        assert started.status_code == 202, started.text
        job = started.json()["job"]
        assert (job["state"], job["total"], job["rate"]) == ("running", LETTERS, RATE)
        # The same letters cannot be replayed again while the job has them.
        second = replay_all(api, auth)
        assert second.status_code == 409, second.text
        assert f"job {job['id']}" in second.json()["detail"]
        one = api.post(f"/api/v1/dead-letters/{dead_letters(db)[-1]['id']}/replay", headers=auth)
        assert one.status_code == 409, one.text

        # Progress is visible while it runs; half-way, the service is killed.
        seen = []
        while (settled := job_of(api, job["id"])["settled"]) < LETTERS // 2:
            seen.append(settled)
            time.sleep(0.2)
        service.kill()
        assert len(set(seen)) >= 5 and seen == sorted(seen), seen

        service = ServiceProcess(settings, tmp_path / "serve-again.log")
        service.start()
        refused = replay_all(api, auth)
        assert refused.status_code == 409, "a second job was accepted while the first ran"
        wait_until(lambda: job_of(api, job["id"])["state"] != "running", 60, "the job to end")
        done = job_of(api, job["id"])
        assert (done["state"], done["sent"], done["failed"], done["progress"]) == (
            "done",
            LETTERS,
            0,
            1.0,
        )
        assert dead_letters(db) == []  # replayed letters are deleted

        received = collector.poll_until(LETTERS, 60)
        collector.drain(2.0)
        copies = Counter(d.value for d in received)
        assert sorted(copies) == sorted(f"v-{i:05d}".encode() for i in range(LETTERS))
        assert max(copies.values()) == 1, [v for v, n in copies.items() if n > 1][:5]
        sample = next(d for d in received if d.value == b"v-00042")
        assert sample.key == b"k42" and sample.headers[0] == ("trace-id", b"t42")
        # Of the redrive headers, only the loop guard's: its round, its letter.
        assert [name for name, _ in sample.headers[1:]] == ["redrive-replays", "redrive-replay-of"]
        assert sample.header("redrive-replays") == b"1"

        # The job writes what it sent to the audit log just after its state reads done.
        wait_until(lambda: "replay" in audit_actions(api), 30, "the job's replay in the audit log")
        audit = api.get("/api/v1/audit").json()["items"]
        actions = {a["action"]: a for a in audit}
        assert actions["replay-job"]["count"] == LETTERS
        assert actions["replay-job"]["filter"] == {"error_type": "orders.Timeout"}
        assert actions["replay"]["count"] == LETTERS
        assert actions["replay"]["detail"]["job"] == job["id"]
    finally:
        api.close()
        collector.close()
        service.terminate()


@dataclass
class Env:
    api: httpx.Client
    auth: dict[str, str]
    database_url: str
    destination: str
    bootstrap: str


@pytest.fixture
def env(bootstrap: str, database_url: str, new_topic: Callable[..., str]) -> Iterator[Env]:
    destination = new_topic("replayed")
    settings = settings_for(
        bootstrap, fresh_database(database_url), allowed_destinations=[destination]
    )
    with running_service(settings) as service:
        produce(bootstrap, settings.requests_topic, dead_letter_requests(destination, 40, "c"))
        wait_until(lambda: len(dead_letters(service.database_url)) == 40, 30, "40 dead letters")
        auth = {"Authorization": f"Bearer {service.tokens.create('olivia', 'operator')}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as api:
            yield Env(api, auth, service.database_url, destination, bootstrap)


def test_a_cancelled_job_sends_nothing_more_and_keeps_the_rest(env: Env) -> None:
    collector = Collector(env.bootstrap, env.destination)
    try:
        job = replay_all(env.api, env.auth, rate=10).json()["job"]
        wait_until(lambda: job_of(env.api, job["id"])["sent"] >= 4, 20, "a few letters sent")
        cancelled = env.api.post(f"/api/v1/jobs/{job['id']}/cancel", headers=env.auth)
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["state"] == "cancelled"
        assert cancelled.json()["cancelled_by"] == "olivia"
        # A batch the cancel overtook is aborted, not sent; one being sent when the cancel
        # came is recorded as sent just after.
        wait_for(lambda: sent_or_cancelled(job_of(env.api, job["id"])) == 40, 30)
        final = job_of(env.api, job["id"])
        assert final["sent"] + final["cancelled"] == 40 and final["cancelled"] > 0, final
        collector.poll_until(final["sent"], 30)
        received = collector.drain(2.0)  # and no more
        assert len(received) == final["sent"]
        # What was not sent stays a dead letter, and may be replayed by a new job.
        assert len(dead_letters(env.database_url)) == final["cancelled"]
        again = replay_all(env.api, env.auth, rate=1000, keep=True)
        assert again.status_code == 202, again.text
        assert again.json()["job"]["total"] == final["cancelled"]
    finally:
        collector.close()
    # The first job's creation and cancel, the second's creation, and what the second
    # sent once it ended (the cancelled job audits no replay); newest first.
    expected = ["replay", "replay-job", "cancel-replay-job", "replay-job"]
    wait_for(lambda: audit_actions(env.api)[:4] == expected, 30)
    assert audit_actions(env.api)[:4] == expected


def test_job_refusals(env: Env) -> None:
    viewer = env.api.post("/api/v1/dead-letters/replay", json={"filter": {}, "all": True})
    assert viewer.status_code == 401
    outside = env.api.post(
        "/api/v1/dead-letters/replay",
        headers=env.auth,
        json={"filter": {}, "all": True, "destination": "not-allowed"},
    )
    assert outside.status_code == 400 and "not in the allowlist" in outside.json()["detail"]
    assert env.api.get("/api/v1/jobs").json()["items"] == []  # a refusal makes no job
    unknown = env.api.post("/api/v1/jobs/424242/cancel", headers=env.auth)
    assert unknown.status_code == 404


@pytest.mark.parametrize("kafka_committed", [False, True], ids=["aborted", "committed"])
def test_a_batch_a_crash_left_open_is_settled_by_what_kafka_did(
    bootstrap: str, database_url: str, new_topic: Callable[..., str], kafka_committed: bool
) -> None:
    """A runner that died after recording a batch as `sending`, before (or after) its
    Kafka transaction committed: the next runner reads what the broker did, and sends
    the batch again only if it was aborted."""
    destination = new_topic("replayed")
    db = fresh_database(database_url)
    # Intake only: no runner here, the test plays the one that dies.
    settings = settings_for(bootstrap, db, allowed_destinations=[destination], roles=["intake"])
    collector = Collector(bootstrap, destination)
    try:
        with running_service(settings) as service:
            produce(bootstrap, settings.requests_topic, dead_letter_requests(destination, 8, "o"))
            wait_until(lambda: len(dead_letters(db)) == 8, 30, "8 dead letters")
            auth = {"Authorization": f"Bearer {service.tokens.create('olivia', 'operator')}"}
            with httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}") as api:
                job_id = replay_all(api, auth, rate=1000).json()["job"]["id"]
            jobs = service.store.replay_jobs
            rows = service.store.dead_letters_by_id(jobs.next_todo(job_id, limit=5))
            producer = Producer(
                {
                    "bootstrap.servers": bootstrap,
                    "transactional.id": f"redrive.{settings.group_id}.replay-job-{job_id}",
                }
            )
            producer.init_transactions(30)
            producer.begin_transaction()
            placed: list[Placed] = []
            for row in rows:
                producer.produce(
                    destination,
                    key=row.msg_key,
                    value=row.msg_value,
                    on_delivery=lambda err, msg, i=row.id: placed.append(
                        Placed(i, msg.topic(), msg.partition(), msg.offset())
                    ),
                )
            producer.flush(30)
            assert jobs.mark_sending(job_id, placed)
            if kafka_committed:
                producer.commit_transaction(30)
            # ... and the runner dies here, its transaction open or its outcome unrecorded.
            assert [p.letter_id for p in jobs.sending(job_id)] == [r.id for r in rows]

        restarted = settings.model_copy(update={"roles": ["scheduler"]})
        with running_service(restarted) as service:
            wait_until(
                lambda: (
                    (job := service.store.replay_jobs.get(job_id)) is not None
                    and job.state == "done"
                ),
                60,
                "the job to end",
            )
        collector.poll_until(8, 30)
        received = collector.drain(2.0)  # and no copies
        copies = Counter(d.value for d in received)
        assert sorted(copies) == sorted(f"o-{i:05d}".encode() for i in range(8))
        assert max(copies.values()) == 1, copies
    finally:
        collector.close()
