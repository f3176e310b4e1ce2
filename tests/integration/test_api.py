"""The REST API on the real service and database: every endpoint, and the refusals."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from redrive.deadlines import Deadline
from redrive.headers import decode
from tests.integration.api_harness import Env, env, ids_of
from tests.integration.service_harness import (
    Collector,
    fresh_database,
    now_ms,
    produce,
    request_headers,
    running_service,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.integration

__all__ = ["env"]  # the fixture


def test_list_filters_and_cursor_pagination(env: Env) -> None:
    first_page = env.api.get("/api/v1/dead-letters")
    assert first_page.status_code == 200, first_page.text
    everything = first_page.json()["items"]
    assert len(everything) == 7
    assert [i["id"] for i in everything] == sorted((i["id"] for i in everything), reverse=True)
    assert len(ids_of(env, error_type="billing.Timeout")) == 3
    assert len(ids_of(env, text="SAID 3")) == 1  # any case, anywhere in the message
    assert len(ids_of(env, text="%")) == 0  # LIKE wildcards are literal
    assert len(ids_of(env, group="billing", topic=env.topic)) == 6
    assert len(ids_of(env, reason="invalid_request")) == 1
    assert len(ids_of(env, since="2000-01-01T00:00:00Z")) == 7
    assert ids_of(env, until="2000-01-01T00:00:00Z") == []
    pages, cursor = [], None
    while True:
        params = {"limit": "3", **({"cursor": cursor} if cursor else {})}
        body = env.api.get("/api/v1/dead-letters", params=params).json()
        pages.append([i["id"] for i in body["items"]])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [i for page in pages for i in page] == [i["id"] for i in everything]


def test_get_one_shows_text_json_hex_headers_and_trace(env: Env) -> None:
    (letter_id,) = ids_of(env, text="said 4")
    body = env.api.get(f"/api/v1/dead-letters/{letter_id}").json()
    assert body["value"]["json"] == {"n": 4}
    assert body["value"]["text"] == '{"n": 4}'
    assert body["value"]["hex"] == b'{"n": 4}'.hex()
    assert body["key"]["text"] == "k4"
    assert {"name": "trace-id", "text": "abc", "base64": "YWJj"} in body["headers"]
    assert body["reason_code"] == "sent_to_dlq" and "attempts exhausted" in body["reason"]
    assert body["original"] == {"topic": env.topic, "partition": 0, "offset": 4, "timestamp": None}
    (binary_id,) = ids_of(env, reason="invalid_request")
    binary = env.api.get(f"/api/v1/dead-letters/{binary_id}").json()
    assert binary["value"]["text"] is None and binary["value"]["hex"] == "00ff"
    assert env.api.get("/api/v1/dead-letters/999999").status_code == 404


def test_refusals_are_clear_4xx(env: Env) -> None:
    (letter_id,) = ids_of(env, text="said 1")
    no_token = env.api.post(f"/api/v1/dead-letters/{letter_id}/replay")
    assert no_token.status_code == 401 and "operator token" in no_token.json()["detail"]
    as_viewer = env.api.post(f"/api/v1/dead-letters/{letter_id}/replay", headers=env.viewer)
    assert as_viewer.status_code == 403 and "operator needed" in as_viewer.json()["detail"]
    forged = env.api.post(
        f"/api/v1/dead-letters/{letter_id}/replay",
        headers={"Authorization": "Bearer rdv_not-a-real-token"},
    )
    assert forged.status_code == 401 and "unknown or revoked" in forged.json()["detail"]
    outside = env.api.post(
        f"/api/v1/dead-letters/{letter_id}/replay",
        headers=env.operator,
        json={"destination": env.outside},
    )
    assert outside.status_code == 400 and "not in the allowlist" in outside.json()["detail"]
    internal = env.api.post(
        f"/api/v1/dead-letters/{letter_id}/replay",
        headers=env.operator,
        json={"destination": "__consumer_offsets"},
    )
    assert internal.status_code == 400
    assert (
        env.api.delete(f"/api/v1/dead-letters/{letter_id}", headers=env.viewer).status_code == 403
    )
    for params, text in [
        ({"since": "yesterday"}, "since"),
        ({"since": "2030-01-01T00:00:00Z", "until": "2020-01-01T00:00:00Z"}, "until"),
        ({"limit": "0"}, "limit"),
        ({"limit": "many"}, "limit"),
    ]:
        bad = env.api.get("/api/v1/dead-letters", params=params)
        assert bad.status_code == 422, (params, bad.text)
        assert text in bad.json()["detail"]
    bad_cursor = env.api.get("/api/v1/dead-letters", params={"cursor": "nonsense"})
    assert bad_cursor.status_code == 400 and "cursor" in bad_cursor.json()["detail"]
    everything = env.api.post(
        "/api/v1/dead-letters/delete", headers=env.operator, json={"filter": {}}
    )
    assert everything.status_code == 422 and "all=true" in everything.json()["detail"]
    unknown_field = env.api.post(
        "/api/v1/dead-letters/delete", headers=env.operator, json={"filter": {"topicz": "x"}}
    )
    assert unknown_field.status_code == 422 and "topicz" in unknown_field.json()["detail"]
    assert len(ids_of(env)) == 7  # nothing was touched by any refusal


def test_replay_one_edit_and_replay_and_the_audit_log(env: Env) -> None:
    collector = Collector(env.bootstrap, env.topic)
    (first,) = ids_of(env, text="said 2")
    replayed = env.api.post(f"/api/v1/dead-letters/{first}/replay", headers=env.operator)
    assert replayed.status_code == 200, replayed.text
    assert replayed.json()["replayed"] == 1
    (second,) = ids_of(env, text="said 3")
    edited = env.api.post(
        f"/api/v1/dead-letters/{second}/replay",
        headers=env.operator,
        json={"value": {"json": {"n": 33}}, "destination": env.other, "keep": True},
    )
    assert edited.status_code == 200, edited.text
    got = collector.poll_until(1, 20)
    collector.close()
    assert got[0].key == b"k2" and got[0].value == b'{"n": 2}'
    # A replay starts fresh: the user's headers, and of the redrive headers only its
    # round and the letter it is replayed from (the loop guard's).
    assert got[0].headers == [
        ("trace-id", b"abc"),
        ("redrive-replays", b"1"),
        ("redrive-replay-of", str(first).encode()),
    ]
    other = Collector(env.bootstrap, env.other)
    got_other = other.poll_until(1, 20)
    other.close()
    assert got_other[0].value == b'{"n": 33}'
    assert first not in ids_of(env) and second in ids_of(env)  # kept on request
    audit = env.api.get("/api/v1/audit").json()["items"]
    assert [(a["action"], a["actor"], a["ids"]) for a in audit[:2]] == [
        ("edit-and-replay", "olivia", [second]),
        ("replay", "olivia", [first]),
    ]

    # The audit log searched: by the letter it names, who, what, and when.
    def found(**params: str) -> list[tuple[str, list[int]]]:
        answer = env.api.get("/api/v1/audit", params=params)
        assert answer.status_code == 200, answer.text
        return [(a["action"], a["ids"]) for a in answer.json()["items"]]

    assert found(letter=str(first)) == [("replay", [first])]
    assert found(letter=str(second), actor="olivia") == [("edit-and-replay", [second])]
    assert found(letter=str(second), action="replay") == []
    assert found(letter=str(first), actor="someone-else") == []
    at = audit[0]["at"]
    assert found(letter=str(second), since=at) == [("edit-and-replay", [second])]
    assert found(letter=str(second), until=at) == []
    assert env.api.get("/api/v1/audit", params={"letter": "0"}).status_code == 422


def test_replay_a_filter_delete_selections_and_export(env: Env) -> None:
    collector = Collector(env.bootstrap, env.topic)
    result = env.api.post(
        "/api/v1/dead-letters/replay",
        headers=env.operator,
        json={"filter": {"error_type": "billing.Timeout"}, "rate": 100},
    )
    assert result.status_code == 202, result.text
    job = result.json()["job"]
    assert result.json()["remaining"] == 0
    assert (job["total"], job["actor"], job["rate"]) == (3, "olivia", 100)
    assert result.headers["location"] == f"/api/v1/jobs/{job['id']}"
    done = wait_for_job(env, job["id"])
    assert (done["state"], done["sent"], done["settled"], done["progress"]) == ("done", 3, 3, 1.0)
    # The job writes what it sent to the audit log just after its state reads done.
    wait_until(lambda: "replay" in audit_actions(env), 30, "the job's replay in the audit log")
    assert len(collector.poll_until(3, 20)) == 3
    collector.close()
    assert [j["id"] for j in env.api.get("/api/v1/jobs").json()["items"]] == [job["id"]]
    # Nothing is left to replay, and an ended job cannot be cancelled.
    again = env.api.post(
        "/api/v1/dead-letters/replay",
        headers=env.operator,
        json={"filter": {"error_type": "billing.Timeout"}},
    )
    assert again.status_code == 400 and "no dead letter matches" in again.json()["detail"]
    ended = env.api.post(f"/api/v1/jobs/{job['id']}/cancel", headers=env.operator)
    assert ended.status_code == 409 and "done already" in ended.json()["detail"]
    assert env.api.get("/api/v1/jobs/999999").status_code == 404
    exported = env.api.get("/api/v1/dead-letters/export", params={"error_type": "billing.Bad"})
    lines = [json.loads(line) for line in exported.text.splitlines()]
    assert exported.headers["content-type"].startswith("application/x-ndjson")
    assert len(lines) == 3 and all(line["error_type"] == "billing.Bad" for line in lines)
    one = lines[0]["id"]
    assert env.api.delete(f"/api/v1/dead-letters/{one}", headers=env.operator).json() == {
        "deleted": 1,
        "ids": [one],
    }
    rest = [line["id"] for line in lines[1:]]
    by_ids = env.api.post("/api/v1/dead-letters/delete", headers=env.operator, json={"ids": rest})
    assert by_ids.json()["deleted"] == 2
    by_filter = env.api.post(
        "/api/v1/dead-letters/delete", headers=env.operator, json={"filter": {}, "all": True}
    )
    assert by_filter.json()["deleted"] == 1  # the invalid request was all that was left
    assert ids_of(env) == []
    # The job's creation, then what it sent (written by the job when it ended).
    assert audit_actions(env) == ["delete", "delete", "delete", "replay", "replay-job"]


def audit_actions(env: Env) -> list[str]:
    """The audit log's actions, newest first."""
    return [a["action"] for a in env.api.get("/api/v1/audit").json()["items"]]


def wait_for_job(env: Env, job_id: int, timeout_s: float = 30) -> dict[str, Any]:
    deadline = Deadline(timeout_s)
    while (job := env.api.get(f"/api/v1/jobs/{job_id}").json())["state"] == "running":
        assert not deadline.passed(), f"replay job {job_id} did not end: {job}"
        time.sleep(0.1)
    return job


def test_pending_list_get_retry_now_and_cancel(env: Env) -> None:
    far = now_ms() + 3_600_000
    produce(
        env.bootstrap,
        env.service.settings.requests_topic,
        [
            {
                "key": f"p{i}".encode(),
                "value": b"later",
                "headers": request_headers(env.topic, far + i, group="billing"),
            }
            for i in range(3)
        ],
    )
    deadline = Deadline(20)
    items: list[dict[str, object]] = []
    while len(items) < 3 and not deadline.passed():
        items = env.api.get("/api/v1/pending", params={"destination": env.topic}).json()["items"]
        time.sleep(0.1)
    assert [i["due_ms"] for i in items] == [far, far + 1, far + 2]
    first, second = items[0]["id"], items[1]["id"]
    detail = env.api.get(f"/api/v1/pending/{first}").json()
    assert detail["key"]["text"] == "p0" and detail["value"]["text"] == "later"
    collector = Collector(env.bootstrap, env.topic)
    collector.poll_until(1, 1.0)
    now = env.api.post(f"/api/v1/pending/{first}/retry-now", headers=env.operator)
    assert now.status_code == 200, now.text
    arrived = collector.poll_until(1, 10)
    collector.close()
    assert [d.key for d in arrived] == [b"p0"]
    assert decode(arrived[0].headers)[0].retry_at == far  # the contract headers, unchanged
    cancel = env.api.post(f"/api/v1/pending/{second}/cancel", headers=env.operator)
    assert cancel.status_code == 200
    assert env.api.get(f"/api/v1/pending/{second}").status_code == 404
    cancelled = ids_of(env, reason="cancelled")
    assert len(cancelled) == 1
    assert "olivia" in env.api.get(f"/api/v1/dead-letters/{cancelled[0]}").json()["reason"]
    assert env.api.post("/api/v1/pending/424242/retry-now", headers=env.operator).status_code == 404
    assert env.api.post(f"/api/v1/pending/{first}/cancel", headers=env.viewer).status_code == 403


def test_stats_rates_whoami_and_openapi(env: Env) -> None:
    stats = env.api.get("/api/v1/stats").json()
    assert stats["dead_letters"]["total"] == 7
    assert {"key": "billing.Timeout", "count": 3} in stats["dead_letters"]["by_error_type"]
    assert {"key": env.topic, "count": 6} in stats["dead_letters"]["by_topic"]
    assert {"key": "billing", "count": 6} in stats["dead_letters"]["by_group"]
    rates = env.api.get("/api/v1/stats/rates", params={"minutes": 5}).json()
    dead = rates["series"]["dead_lettered"]
    assert len(dead) == 5 and sum(point["count"] for point in dead) == 7
    assert env.api.get("/api/v1/whoami", headers=env.viewer).json() == {
        "name": "victor",
        "role": "viewer",
    }
    spec = env.api.get("/openapi.json").json()
    for path in [
        "/api/v1/dead-letters",
        "/api/v1/dead-letters/{letter_id}/replay",
        "/api/v1/pending/{pending_id}/cancel",
        "/api/v1/stats/rates",
        "/api/v1/audit",
    ]:
        assert path in spec["paths"]


def test_reads_can_require_a_token(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    settings = settings_for(bootstrap, fresh_database(database_url), require_token_for_reads=True)
    with (
        running_service(settings) as service,
        httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}") as api,
    ):
        assert api.get("/api/v1/dead-letters").status_code == 401
        token = service.tokens.create("reader", "viewer")
        ok = api.get("/api/v1/dead-letters", headers={"Authorization": f"Bearer {token}"})
        assert ok.status_code == 200
        service.tokens.revoke("reader")
        service.tokens._cache.clear()
        revoked = api.get("/api/v1/dead-letters", headers={"Authorization": f"Bearer {token}"})
        assert revoked.status_code == 401
        # whoami is a read like any other (it answered 200 "anonymous" without a token).
        assert api.get("/api/v1/whoami").status_code == 401
        viewer = service.tokens.create("reader-2", "viewer")
        me = api.get("/api/v1/whoami", headers={"Authorization": f"Bearer {viewer}"})
        assert me.status_code == 200 and me.json() == {"name": "reader-2", "role": "viewer"}
        spec = api.get("/openapi.json").json()
        # Reads need the bearer token here: no empty (optional) security requirement.
        assert spec["paths"]["/api/v1/whoami"]["get"]["security"] == [{"HTTPBearer": []}]
