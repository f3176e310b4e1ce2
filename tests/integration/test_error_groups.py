"""Error groups on a real PostgreSQL: letters of one failure are one group whatever
their ids and numbers; a group's replay, delete and mute, and a letter moved, are
done and audited; letters stored before groups existed are grouped by the migration."""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter

import psycopg
import pytest

from redrive.reasons import DeadLetterReason
from redrive.records import DeadLetterRecord, RequestCoordinates
from redrive.service.filters import DeadLetterFilter
from redrive.service.group_metrics import SURGE_MIN_LETTERS, surging
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


def test_letters_back_from_a_replay_do_not_make_their_group_surge(database_url: str) -> None:
    """A replay of a group whose letters come back dead is the same failures seen again:
    the group's surge figures (the gauges, the overview, the alert) do not count them."""
    store = Store(fresh_database(database_url))
    store.open()
    try:
        count = SURGE_MIN_LETTERS + 10
        new = [_letter(4 * n) for n in range(count)]  # one failure: billing.Timeout
        came_back = [
            dataclasses.replace(_letter(4 * n + 1), replay_of=1_000_000 + n, replays=1)
            for n in range(count)  # orders.NotFound, each back from its first replay
        ]
        store.insert_batch([], new + came_back, now_ms=now_ms())
        titles = {g.error_group: g.title for g in store.error_groups(limit=10)}
        surges = {titles[s.error_group]: s for s in store.error_group_surges(limit=10)}
        timeout = surges["billing.Timeout: gateway <uuid> timed out after <n> ms"]
        assert timeout.last_hour == count and surging(timeout)
        assert not any(t.startswith("orders.NotFound") for t in surges), surges
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


def test_the_groups_computed_again_keep_moves_and_mutes(database_url: str) -> None:
    """Migration 017: under the earlier rules KeyError('brand') and KeyError('sku') were
    one group ("KeyError: '<q>'"), muted, with a letter moved into it; after it, they
    are two groups, both muted, and the moved letter is in a group of its own (the
    group it was moved to is split); a group the rules leave whole keeps its letters
    together with the letter moved into it."""
    url = fresh_database(database_url)
    store = Store(url)
    store.open()

    def letter(n: int, error_type: str, message: str) -> DeadLetterRecord:
        return dataclasses.replace(
            _letter(n), error_type=error_type, error_message=message, error_trace=None
        )

    keys = [letter(n, "KeyError", f"'{k}'") for n, k in enumerate(("brand", "brand", "sku"))]
    timeouts = [
        letter(10 + n, "billing.Timeout", f"gateway timed out after {n} ms") for n in range(3)
    ]
    try:
        store.insert_batch([], [*keys, *timeouts, _letter(21), _letter(22)], now_ms=now_ms())
    finally:
        store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        # Back to what the earlier rules stored: one group for the three KeyErrors,
        # muted; the last letter moved into it, a Timeout moved among the timeouts'.
        ids = [r[0] for r in conn.execute("SELECT id FROM redrive_dead_letters ORDER BY id")]
        old_keys, old_timeouts = "00000000000000aa", "00000000000000bb"
        conn.execute(
            "UPDATE redrive_dead_letters SET fingerprint = %s, error_group = %s WHERE id = ANY(%s)",
            (old_keys, old_keys, ids[:3]),
        )
        conn.execute(
            "UPDATE redrive_dead_letters SET fingerprint = %s, error_group = %s WHERE id = ANY(%s)",
            (old_timeouts, old_timeouts, ids[3:6]),
        )
        conn.execute(
            "INSERT INTO redrive_error_groups (error_group, title, muted, muted_by)"
            " VALUES (%s, 'KeyError: ''<q>''', true, 'alice'), (%s, 't', false, null)",
            (old_keys, old_timeouts),
        )
        for moved_to, letter_id in ((old_keys, ids[6]), (old_timeouts, ids[7])):
            conn.execute(
                "UPDATE redrive_dead_letters SET error_group = %s WHERE id = %s",
                (moved_to, letter_id),
            )
        conn.execute("DELETE FROM redrive_schema_migrations WHERE version >= 17")
        assert migrate(conn, after=MIGRATION_STEPS) == ["017_fingerprints_again"]
        rows = conn.execute(
            "SELECT d.id, d.fingerprint, d.error_group, g.title, g.muted, g.muted_by"
            " FROM redrive_dead_letters d JOIN redrive_error_groups g USING (error_group)"
            " ORDER BY d.id"
        ).fetchall()
        leftover = conn.execute(
            "SELECT count(*) FROM redrive_error_groups WHERE error_group = ANY(%s)",
            ([old_keys, old_timeouts],),
        ).fetchone()
    by_id = {r[0]: r[1:] for r in rows}
    brand, brand_again, sku = (by_id[i] for i in ids[:3])
    assert brand[2:] == brand_again[2:] == ("KeyError: 'brand'", True, "alice")
    assert sku[2:] == ("KeyError: 'sku'", True, "alice")
    assert brand[1] == brand_again[1] != sku[1]
    [timeout_group] = {by_id[i][1] for i in ids[3:6]}
    assert by_id[ids[3]][2] == "billing.Timeout: gateway timed out after <n> ms"
    moved_in = by_id[ids[7]]
    assert moved_in[1] == timeout_group != moved_in[0], "moved into a whole group: stays"
    moved = by_id[ids[6]]
    assert moved[1] == moved[0], "moved into a group the rules split: its own group"
    assert leftover == (0,)
