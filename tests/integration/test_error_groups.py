"""Error groups on a real PostgreSQL: letters of one failure are one group whatever
their ids and numbers; a group's replay, delete and mute, and a letter moved, are
done and audited; letters stored before groups existed are grouped by the migration."""

from __future__ import annotations

import uuid
from collections import Counter

import psycopg
import pytest

from redrive.reasons import DeadLetterReason
from redrive.records import DeadLetterRecord, RequestCoordinates
from redrive.service.filters import DeadLetterFilter
from redrive.service.migrations import migrate
from redrive.service.store import MIGRATION_STEPS, Store
from redrive.service.store.error_groups import grouping_of
from tests.integration.api_harness import Env, env
from tests.integration.service_harness import Collector, fresh_database, now_ms, wait_until
from tests.integration.test_api import audit_actions, wait_for_job

pytestmark = pytest.mark.integration

__all__ = ["env"]  # the fixture

JAVA_TRACE = """java.lang.IllegalStateException: sku 'SKU-{n}' has no price
\tat java.base/java.util.Optional.orElseThrow(Optional.java:403)
\tat com.example.prices.PriceListener.onMessage(PriceListener.java:{n})
\tat org.springframework.kafka.listener.KafkaMessageListenerContainer.invoke(K.java:1)
"""

# Four failures, each message with what varies from one letter to the next.
FAILURES = [
    ("billing.Timeout", lambda n: f"gateway {uuid.uuid4()} timed out after {n * 7} ms", None),
    (
        "orders.NotFound",
        lambda n: f"order order-{n} not found for customer c{n}@example.com",
        None,
    ),
    (
        "json.decoder.JSONDecodeError",
        lambda n: f"Expecting value: line 1 column {n} (char {n})",
        None,
    ),
    ("java.lang.IllegalStateException", lambda n: f"sku 'SKU-{n}' has no price", JAVA_TRACE),
]


def _letter(n: int) -> DeadLetterRecord:
    error_type, message, trace = FAILURES[n % 4]
    return DeadLetterRecord(
        topic=f"orders-{n % 3}",
        key=f"k{n}".encode(),
        value=b"{}",
        headers=[],
        reason_code=DeadLetterReason.ATTEMPTS_EXHAUSTED,
        reason=f"attempts exhausted ({n % 5} of 5)",
        source="intake",
        attempt=3,
        request=RequestCoordinates("redrive.requests", 0, n),
        identity=uuid.uuid4().bytes,
        group=f"billing-{n // 4 % 2}",
        original_topic=f"orders-{n % 3}",
        original_partition=0,
        original_offset=n,
        error_type=error_type,
        error_message=message(n),
        error_trace=None if trace is None else trace.format(n=n),
    )


def test_5000_letters_of_4_failures_form_exactly_4_groups(database_url: str) -> None:
    store = Store(fresh_database(database_url))
    store.open()
    try:
        letters = [_letter(n) for n in range(5_000)]
        for start in range(0, len(letters), 1_000):
            store.insert_batch([], letters[start : start + 1_000], now_ms=now_ms())
        groups = store.error_groups(limit=500)
        assert len(groups) == 4
        assert sorted(g.count for g in groups) == [1250] * 4
        assert {g.title for g in groups} == {
            "billing.Timeout: gateway <uuid> timed out after <n> ms",
            "orders.NotFound: order <n> not found for customer <email>",
            "json.decoder.JSONDecodeError: Expecting value: line <n> column <n> (char <n>)",
            "java.lang.IllegalStateException: sku '<q>' has no price",
        }
        for group in groups:
            assert group.topics == ("orders-0", "orders-1", "orders-2")
            assert group.consumer_groups == ("billing-0", "billing-1")
            assert sum(group.hourly) == 1250 and group.hourly[-1] == 1250
            assert group.first_seen <= group.last_seen and not group.muted
            assert store.count_dead_letters(DeadLetterFilter(error_group=group.error_group)) == 1250
        by_last_seen = store.error_groups(order="last_seen", topic="orders-1", limit=2)
        assert len(by_last_seen) == 2
        assert store.error_groups(topic="elsewhere") == []
    finally:
        store.close()


def test_the_migration_groups_the_letters_stored_before_it(database_url: str) -> None:
    url = fresh_database(database_url)
    letters = [_letter(n) for n in range(40)]
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn, up_to=11)
        with conn.transaction():
            for letter in letters:
                conn.execute(
                    "INSERT INTO redrive_dead_letters (topic, headers, reason_code, reason,"
                    " source, error_type, error_message, error_trace, request_topic,"
                    " request_partition, request_offset) VALUES"
                    " (%s, '\\x90', %s, %s, 'intake', %s, %s, %s, 'r', 0, %s)",
                    (
                        letter.topic,
                        letter.reason_code.value,
                        letter.reason,
                        letter.error_type,
                        letter.error_message,
                        letter.error_trace,
                        letter.original_offset,
                    ),
                )
            conn.execute(
                "INSERT INTO redrive_dead_letters (topic, headers, reason_code, reason, source)"
                " VALUES ('t', '\\x90', 'destination_not_allowed',"
                " 'destination ''x'' is not allowed', 'intake')"
            )
        assert migrate(conn, after=MIGRATION_STEPS)[0] == "012_error_groups"
        rows = conn.execute(
            "SELECT fingerprint, error_group FROM redrive_dead_letters ORDER BY id"
        ).fetchall()
    # The groups the store gives a letter it stores now, and the groups' rows.
    expected = [
        grouping_of(r.error_type, r.error_message, r.error_trace, r.reason_code.value, r.reason)
        for r in letters
    ]
    assert [r[0] for r in rows[:-1]] == [g.fingerprint for g in expected]
    assert all(fingerprint == group for fingerprint, group in rows)
    assert len(Counter(r[0] for r in rows)) == 5
    store = Store(url)
    store.open()
    try:
        titles = {g.title for g in store.error_groups()}
        assert "destination_not_allowed: destination '<q>' is not allowed" in titles
        assert len(titles) == 5
    finally:
        store.close()


def _groups(env: Env, **params: str) -> dict[str, dict[str, object]]:
    response = env.api.get("/api/v1/error-groups", params=params)
    assert response.status_code == 200, response.text
    return {str(g["title"]): g for g in response.json()["items"]}


def test_group_mute_move_replay_and_delete_are_done_and_audited(env: Env) -> None:
    groups = _groups(env)
    # Three letters "gateway said <n>" of each type, and the refused request.
    timeout = groups["billing.Timeout: gateway said <n>"]
    bad = groups["billing.Bad: gateway said <n>"]
    assert (timeout["count"], bad["count"], len(groups)) == (3, 3, 3)
    assert timeout["topics"] == [env.topic] and timeout["groups"] == ["billing"]
    t_id, b_id = timeout["error_group"], bad["error_group"]
    assert env.api.get(f"/api/v1/error-groups/{t_id}").json()["count"] == 3
    assert env.api.get("/api/v1/error-groups/0123456789abcdef").status_code == 404
    assert env.api.get("/api/v1/error-groups/not-a-group").status_code == 422

    # Mute: an operator's, audited; a viewer may not.
    assert env.api.post(f"/api/v1/error-groups/{t_id}/mute", headers=env.viewer).status_code == 403
    muted = env.api.post(f"/api/v1/error-groups/{t_id}/mute", headers=env.operator)
    assert muted.json() == {"error_group": t_id, "muted": True}
    assert list(_groups(env, muted="true")) == ["billing.Timeout: gateway said <n>"]
    assert audit_actions(env)[0] == "mute-group"
    # The surge gauges name each group active in the last hour, muted or not.
    metrics = env.api.get("/metrics").text
    assert (
        f'redrive_error_group_letters_last_hour{{error_group="{t_id}",muted="true"}} 3.0' in metrics
    )
    assert f'redrive_error_group_surge_ratio{{error_group="{b_id}",muted="false"}} 3.0' in metrics

    # Move a letter of the Bad group into the Timeout group: its fingerprint is kept.
    letters = env.api.get(f"/api/v1/error-groups/{b_id}/dead-letters").json()["items"]
    moved = letters[0]["id"]
    answer = env.api.post(
        f"/api/v1/dead-letters/{moved}/move", headers=env.operator, json={"error_group": t_id}
    )
    assert answer.json() == {"id": moved, "from": b_id, "error_group": t_id}
    detail = env.api.get(f"/api/v1/dead-letters/{moved}").json()
    assert (detail["error_group"], detail["fingerprint"]) == (t_id, b_id)
    assert env.api.get(f"/api/v1/error-groups/{t_id}").json()["count"] == 4
    entry = env.api.get("/api/v1/audit").json()["items"][0]
    assert (entry["action"], entry["ids"], entry["detail"]) == (
        "move-to-group",
        [moved],
        {"from": b_id, "to": t_id},
    )
    missing = env.api.post(
        f"/api/v1/dead-letters/{moved}/move",
        headers=env.operator,
        json={"error_group": "0123456789abcdef"},
    )
    assert missing.status_code == 404

    # Replay the Bad group (two letters left): a replay job over the group.
    collector = Collector(env.bootstrap, env.topic)
    started = env.api.post(
        f"/api/v1/error-groups/{b_id}/replay", headers=env.operator, json={"rate": 100}
    )
    assert started.status_code == 202, started.text
    job = started.json()["job"]
    assert (job["total"], job["filter"]) == (2, {"error_group": b_id})
    assert wait_for_job(env, job["id"])["state"] == "done"
    assert len(collector.poll_until(2, 20)) == 2
    collector.close()
    wait_until(lambda: "replay" in audit_actions(env), 30, "the job's replay in the audit log")
    assert env.api.get(f"/api/v1/error-groups/{b_id}").status_code == 404

    # Delete the Timeout group, the moved letter with it.
    deleted = env.api.post(f"/api/v1/error-groups/{t_id}/delete", headers=env.operator)
    assert deleted.json()["deleted"] == 4 and moved in deleted.json()["ids"]
    assert list(_groups(env)) == [next(t for t in groups if t.startswith("invalid_request"))]
    unmuted = env.api.post(f"/api/v1/error-groups/{t_id}/unmute", headers=env.operator)
    assert unmuted.json()["muted"] is False  # the group's state outlives its letters
    assert audit_actions(env)[:5] == [
        "unmute-group",
        "delete",
        "replay",
        "replay-job",
        "move-to-group",
    ]
    delete_entry = env.api.get("/api/v1/audit").json()["items"][1]
    assert delete_entry["filter"] == {"error_group": t_id}
