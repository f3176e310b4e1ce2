"""The REST API on the real service and database, at its limits: extreme stored
values, payloads and texts PostgreSQL refuses, bad filters in the UI, exports, the
OpenAPI description and the methods each path allows."""

from __future__ import annotations

import base64
import json

import psycopg
import pytest

from tests.integration.api_harness import Env, env, ids_of
from tests.integration.service_harness import (
    dead_letters,
    now_ms,
    produce,
    request_headers,
    wait_until,
)

pytestmark = pytest.mark.integration

__all__ = ["env"]  # the fixture

INT64_MAX, INT64_MIN = 2**63 - 1, -(2**63)
INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)


def test_extreme_stored_numbers_show_in_the_api_and_the_ui(env: Env) -> None:
    """Any int64 a producer can set (2**63 - 1 ms as the original timestamp), and the
    extremes the columns hold, are shown, not a 500."""
    produce(
        env.bootstrap,
        env.service.settings.requests_topic,
        [
            {
                "key": b"max",
                "value": b"v",
                "headers": request_headers(
                    env.topic,
                    now_ms(),
                    send_to="dlq",
                    original_topic=env.topic,
                    original_partition=INT32_MAX,
                    original_offset=INT64_MAX,
                    original_timestamp=INT64_MAX,
                    error_message="largest",
                ),
            }
        ],
    )
    wait_until(
        lambda: len(dead_letters(env.service.database_url)) >= 8,
        20,
        "the dead letter with the largest numbers",
    )
    with psycopg.connect(env.service.database_url) as conn:
        conn.execute(
            "INSERT INTO redrive_dead_letters (topic, headers, reason_code, reason, source, "
            "error_message, original_timestamp, original_partition, original_offset, "
            "request_partition, request_offset) VALUES "
            "('t', '\\x90', 'x', 'y', 'test', 'smallest', %s, %s, %s, %s, %s), "
            "('t', '\\x90', 'x', 'y', 'test', 'epoch', 0, 0, 0, 0, 0), "
            "('t', '\\x90', 'x', 'y', 'test', 'before', -1, -1, -1, -1, -1)",
            (INT64_MIN, INT32_MIN, INT64_MIN, INT32_MIN, INT64_MIN),
        )
        conn.execute(
            "INSERT INTO redrive_pending (due_ms, destination, headers, attempt, deadline_ms, "
            "request_topic, request_partition, request_offset) VALUES "
            "(%s, 'nowhere', '\\x90', 1, %s, 'r', 0, 1)",
            (INT64_MAX, INT64_MIN),
        )
    expected = {"largest": INT64_MAX, "smallest": INT64_MIN, "epoch": 0, "before": -1}
    for text, timestamp in expected.items():
        (letter_id,) = ids_of(env, text=text)
        api = env.api.get(f"/api/v1/dead-letters/{letter_id}")
        assert api.status_code == 200, api.text
        assert api.json()["original"]["timestamp"] == timestamp
        page = env.api.get(f"/dead-letters/{letter_id}")
        assert page.status_code == 200, (text, page.text[:500])
    largest = env.api.get(f"/dead-letters/{ids_of(env, text='largest')[0]}").text
    assert "after the year 9999" in largest and "9,223,372,036,854,775,807" in largest
    assert (
        "1970-01-01 00:00:00 UTC"
        in env.api.get(f"/dead-letters/{ids_of(env, text='epoch')[0]}").text
    )
    pending = env.api.get("/pending")
    assert pending.status_code == 200 and "after the year 9999" in pending.text
    (row,) = env.api.get("/api/v1/pending", params={"destination": "nowhere"}).json()["items"]
    assert (row["due_ms"], row["deadline_ms"]) == (INT64_MAX, INT64_MIN)
    # The pending cursor carries due_ms: the last page ends at the largest.
    everything = env.api.get("/api/v1/pending", params={"limit": 1}).json()
    assert everything["next_cursor"] is None and everything["items"][0]["due_ms"] == INT64_MAX


def test_deeply_nested_json_payloads_are_shown_as_text(env: Env) -> None:
    """JSON nested deeper than the parser's stack or the serializer's limit."""
    with psycopg.connect(env.service.database_url) as conn:
        for depth in (300, 5000):
            conn.execute(
                "INSERT INTO redrive_dead_letters (topic, msg_value, headers, reason_code, "
                "reason, source, error_message) VALUES ('t', %s, '\\x90', 'x', 'y', 'test', %s)",
                (b"[" * depth + b"]" * depth, f"nested {depth}"),
            )
    for depth in (300, 5000):
        (letter_id,) = ids_of(env, text=f"nested {depth}")
        api = env.api.get(f"/api/v1/dead-letters/{letter_id}")
        assert api.status_code == 200, api.text[:300]
        assert api.json()["value"]["json"] is None
        assert api.json()["value"]["text"] == "[" * depth + "]" * depth
        assert env.api.get(f"/dead-letters/{letter_id}").status_code == 200
    exported = env.api.get("/api/v1/dead-letters/export", params={"text": "nested"})
    assert exported.status_code == 200 and len(exported.text.splitlines()) == 2


TEXT_FILTERS = ["topic", "group", "error_type", "text", "reason"]


def test_text_postgresql_refuses_is_a_422_naming_the_field(env: Env) -> None:
    for field in TEXT_FILTERS:
        for value in ["a\x00b", "\x00"]:
            for path in ["/api/v1/dead-letters", "/api/v1/dead-letters/export"]:
                bad = env.api.get(path, params={field: value})
                assert bad.status_code == 422, (path, field, bad.text)
                assert field in bad.json()["detail"] and "NUL" in bad.json()["detail"]
                assert bad.headers["content-type"] == "application/json"
    for field in ["destination", "group"]:
        bad = env.api.get("/api/v1/pending", params={field: "a\x00b"})
        assert bad.status_code == 422 and field in bad.json()["detail"], bad.text
    for action in ["replay", "delete"]:
        bad = env.api.post(
            f"/api/v1/dead-letters/{action}",
            headers=env.operator,
            json={"filter": {"text": "said\x00"}},
        )
        assert bad.status_code == 422 and "filter.text" in bad.json()["detail"], bad.text
        # A lone surrogate: JSON can carry it, UTF-8 (so PostgreSQL) cannot.
        surrogate = env.api.post(
            f"/api/v1/dead-letters/{action}",
            headers={**env.operator, "content-type": "application/json"},
            content=b'{"filter": {"text": "\\ud800"}}',
        )
        assert surrogate.status_code == 422, surrogate.text
        assert "filter.text" in surrogate.json()["detail"]
    (letter_id,) = ids_of(env, text="said 1")
    edited = env.api.post(
        f"/api/v1/dead-letters/{letter_id}/replay",
        headers={**env.operator, "content-type": "application/json"},
        content=b'{"value": {"text": "\\udfff"}}',
    )
    assert edited.status_code == 422 and "value.text" in edited.json()["detail"], edited.text
    assert len(ids_of(env)) == 7  # nothing was touched by any refusal


def test_numbers_and_times_beyond_what_postgresql_holds_are_refused(env: Env) -> None:
    for path, params, field in [
        ("/api/v1/pending", {"due_after_ms": str(2**63)}, "due_after_ms"),
        ("/api/v1/pending", {"due_before_ms": "9" * 40}, "due_before_ms"),
        ("/api/v1/dead-letters", {"since": "10000-01-01T00:00:00Z"}, "since"),
        ("/api/v1/dead-letters", {"until": "0"}, "until"),  # not seconds since 1970
        ("/api/v1/dead-letters", {"limit": "9" * 40}, "limit"),
        ("/api/v1/dead-letters/" + "9" * 30, {}, "letter_id"),
        ("/api/v1/pending/" + str(2**63), {}, "pending_id"),
    ]:
        bad = env.api.get(path, params=params)
        assert bad.status_code == 422, (path, params, bad.text)
        assert field in bad.json()["detail"], bad.text
    too_big = env.api.post(
        "/api/v1/dead-letters/delete", headers=env.operator, json={"ids": [2**63]}
    )
    assert too_big.status_code == 422 and "ids" in too_big.json()["detail"]
    for cursor in [base64.urlsafe_b64encode(str(2**63).encode()).decode(), "A" * 200, "é"]:
        bad = env.api.get("/api/v1/dead-letters", params={"cursor": cursor})
        assert bad.status_code in (400, 422), (cursor, bad.text)
        assert "cursor" in bad.json()["detail"]
    # Times at the ends of the calendar, with and without an offset, all work.
    for since, until in [
        ("0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"),
        ("2020-01-01T00:00:00", "2030-01-01T00:00:00Z"),  # naive is UTC
    ]:
        ok = env.api.get("/api/v1/dead-letters", params={"since": since, "until": until})
        assert ok.status_code == 200 and len(ok.json()["items"]) == 7, ok.text


def test_the_ui_pages_show_a_bad_filter_instead_of_failing(env: Env) -> None:
    for field, value in [(name, "a\x00b") for name in TEXT_FILTERS] + [
        ("since", "9" * 40),
        ("until", "0001-01-01T00:00:00+23:59x"),
        ("cursor", "9" * 40),
    ]:
        page = env.api.get("/dead-letters", params={field: value})
        assert page.status_code == 200 and "flash-error" in page.text, (field, value)
    for field in ["destination", "group", "cursor"]:
        page = env.api.get("/pending", params={field: "a\x00b"})
        assert page.status_code == 200 and "flash-error" in page.text, field
    assert env.api.get("/dead-letters/" + "9" * 30).status_code == 404


def test_export_validates_and_reads_before_the_first_byte(env: Env) -> None:
    with env.api.stream("GET", "/api/v1/dead-letters/export", params={"text": "\x00"}) as bad:
        assert bad.status_code == 422
        assert "text" in json.loads(bad.read())["detail"]
    exported = env.api.get("/api/v1/dead-letters/export")
    assert exported.status_code == 200
    assert len(exported.text.splitlines()) == 7


def test_openapi_describes_what_the_api_answers(env: Env) -> None:
    spec = env.api.get("/openapi.json").json()
    paths, schemas = spec["paths"], spec["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    assert schemas["ErrorBody"]["properties"] == {"detail": {"title": "Detail", "type": "string"}}
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    expected = {
        ("/api/v1/dead-letters", "get"): {"400", "401", "422"},
        ("/api/v1/dead-letters/{letter_id}", "get"): {"401", "404", "422"},
        ("/api/v1/dead-letters/{letter_id}", "delete"): {"401", "403", "404", "422"},
        ("/api/v1/dead-letters/{letter_id}/replay", "post"): {
            *("400", "401", "403", "404", "409", "422"),
        },
        ("/api/v1/dead-letters/replay", "post"): {"400", "401", "403", "409", "413", "422"},
        ("/api/v1/jobs/{job_id}", "get"): {"401", "404", "422"},
        ("/api/v1/jobs/{job_id}/cancel", "post"): {"401", "403", "404", "409", "422"},
        ("/api/v1/pending/{pending_id}/cancel", "post"): {"401", "403", "404", "422"},
        ("/api/v1/whoami", "get"): {"401"},
    }
    for (path, method), statuses in expected.items():
        responses = paths[path][method]["responses"]
        assert statuses <= set(responses), (path, method, sorted(responses))
        for status in statuses:
            assert responses[status]["content"] == error, (path, method, status)
    export = paths["/api/v1/dead-letters/export"]["get"]["responses"]["200"]["content"]
    assert list(export) == ["application/x-ndjson"]
    # Reads are open here: the bearer token is optional (an empty requirement).
    assert paths["/api/v1/stats"]["get"]["security"] == [{"HTTPBearer": []}, {}]
    assert paths["/api/v1/dead-letters/delete"]["post"]["security"] == [{"HTTPBearer": []}]
    # Bodies the handlers refuse, the document refuses too.
    for name in ("Selection", "ReplayMany"):
        rules = schemas[name]
        assert [branch["required"] for branch in rules["oneOf"]] == [["ids"], ["filter"]]
        assert rules["then"] == {"required": ["all"], "properties": {"all": {"const": True}}}
    assert len(schemas["Payload"]["oneOf"]) == 3
    cursor = next(
        p for p in paths["/api/v1/dead-letters"]["get"]["parameters"] if p["name"] == "cursor"
    )
    assert "pattern" in cursor["schema"]["anyOf"][0]
    for empty in ({}, {"filter": {}}, {"filter": {"topic": None}}):
        for action in ("replay", "delete"):
            refused = env.api.post(
                f"/api/v1/dead-letters/{action}", headers=env.operator, json=empty
            )
            assert refused.status_code == 422, (action, empty, refused.text)


def test_a_405_names_every_method_the_path_allows(env: Env) -> None:
    for path, allowed in [
        ("/api/v1/dead-letters/1", "DELETE, GET"),
        ("/api/v1/dead-letters/replay", "POST"),
        ("/api/v1/dead-letters", "GET"),
        ("/api/v1/pending/1/cancel", "POST"),
        ("/api/v1/jobs/1", "GET"),
        ("/login", "GET, POST"),
    ]:
        for method in ("OPTIONS", "PUT", "PATCH"):
            refused = env.api.request(method, path)
            assert refused.status_code == 405, (method, path)
            assert refused.headers["allow"] == allowed, (method, path)
