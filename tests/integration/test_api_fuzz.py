"""The REST API fuzzed from its own OpenAPI document (schemathesis), and the web UI's
pages fed hostile input, on the real service: no request may get a 5xx, and every
answer must be what the document says (status, content type, body).

The service runs in-process with a fresh database and answers over HTTP on a real
port; its store is seeded with pending retries and dead letters, some holding the
extremes of what a producer or the database can hold (int64 timestamps and offsets,
int32 partitions). Requests are generated for three roles: without a token, with a
viewer token and with an operator token, whose run also sends every operation's
boundary values (the coverage phase).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest
import schemathesis
from confluent_kafka.admin import AdminClient, NewTopic
from schemathesis import Case, CheckContext, Response
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, from_schema
from schemathesis.engine.events import (
    FatalError,
    FuzzScenarioFinished,
    NonFatalError,
    ScenarioFinished,
)

from redrive.deadlines import Deadline
from redrive.service.service import RetryService
from tests.integration.service_harness import (
    dead_letters,
    fresh_database,
    now_ms,
    produce,
    request_headers,
    running_service,
    settings_for,
)

pytestmark = pytest.mark.integration

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)


@dataclass(frozen=True)
class RoleRun:
    """How much one role's run generates: ``examples`` fuzzed cases an operation, and
    whether the coverage phase (every operation's boundary values, most of a run's
    CPU) runs as well."""

    examples: int
    coverage: bool


# Bounded so that the whole file takes a minute or two on two cores. The operator
# reaches every handler past its checks, so it runs the coverage phase too. The other
# roles meet the role check, behind the same validation the operator's run covers:
# their generated cases look for what the check lets through, not for boundaries.
RUNS = {
    "operator": RoleRun(15, coverage=True),
    "viewer": RoleRun(10, coverage=False),
    "anonymous": RoleRun(8, coverage=False),
}

# The checks that matter here: no server error, and every answer as documented.
# (use_after_free and ensure_resource_availability need the stateful phase, which
# is off; positive data is checked by `schema_valid_input_is_not_refused` below.)
SCHEMATHESIS_CONFIG: dict[str, Any] = {
    "seed": 14,
    "suppress-health-check": ["too_slow", "filter_too_much", "data_too_large"],
    "generation": {"mode": "all", "database": "none"},
    "phases": {"examples": {"enabled": False}, "stateful": {"enabled": False}},
    "checks": {
        "not_a_server_error": {"enabled": True},
        "status_code_conformance": {"enabled": True},
        "content_type_conformance": {"enabled": True},
        "response_schema_conformance": {"enabled": True},
        "response_headers_conformance": {"enabled": True},
        "negative_data_rejection": {"enabled": True},
        "unsupported_method": {"enabled": True},
        "allow_header_conformance": {"enabled": True},
        "missing_required_header": {"enabled": True},
        "ignored_auth": {"enabled": True},
        "positive_data_acceptance": {"enabled": False},
        "use_after_free": {"enabled": False},
        "ensure_resource_availability": {"enabled": False},
        "object_level_authorization": {"enabled": False},
    },
}


@dataclass
class Fuzzed:
    service: RetryService
    base_url: str
    topic: str
    operator: dict[str, str]
    viewer: dict[str, str]


def create_topic(bootstrap: str) -> str:
    name = f"fuzz-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=1)])[name].result(timeout=30)
    return name


def seed_extremes(database_url: str) -> None:
    """Rows only the database can hold: negative and maximal int64 and int32 values
    (the retry headers refuse negative ones, an older writer or a person need not).
    The pending rows are never due, so the scheduler leaves them where they are."""
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO redrive_dead_letters (topic, msg_key, msg_value, headers, attempt, "
            "group_id, original_topic, original_partition, original_offset, "
            "original_timestamp, error_type, error_message, reason_code, reason, source, "
            "request_topic, request_partition, request_offset) VALUES "
            "('extreme-min', NULL, '\\x00ff'::bytea, '\\x90', %s, 'g', 'o', %s, %s, %s, "
            " 'E', 'm', 'x', 'y', 'test', NULL, %s, %s), "
            "('extreme-zero', ''::bytea, ''::bytea, '\\x90', 0, NULL, NULL, 0, 0, 0, "
            " NULL, NULL, 'x', 'y', 'test', NULL, 0, 0)",
            (INT32_MIN, INT32_MIN, INT64_MIN, INT64_MIN, INT32_MIN, INT64_MIN),
        )
        conn.execute(
            "INSERT INTO redrive_pending (due_ms, destination, dest_partition, headers, "
            "attempt, group_id, deadline_ms, original_topic, original_partition, "
            "original_offset, request_topic, request_partition, request_offset) VALUES "
            "(%s, 'extreme-max', %s, '\\x90', %s, 'g', %s, 'o', %s, %s, 'seeded', %s, %s), "
            "(%s, 'extreme-min', NULL, '\\x90', 1, NULL, %s, NULL, NULL, NULL, 'seeded', 0, 0) "
            "ON CONFLICT DO NOTHING",
            (
                INT64_MAX,
                INT32_MAX,
                INT32_MAX,
                INT64_MAX,
                INT32_MAX,
                INT64_MAX,
                INT32_MAX,
                INT64_MAX,
                INT64_MAX - 1,
                INT64_MIN,
            ),
        )


def seed_through_kafka(bootstrap: str, service: RetryService, topic: str) -> None:
    """Dead letters and pending retries the way they arrive: as retry requests, one
    with the largest timestamp, offset and partition the headers can carry."""
    extreme = request_headers(
        topic,
        now_ms(),
        send_to="dlq",
        attempt=INT32_MAX,
        group="billing",
        original_topic=topic,
        original_partition=INT32_MAX,
        original_offset=INT64_MAX,
        original_timestamp=INT64_MAX,
        error_type="billing.Timeout",
        error_message="gateway said \x00 and \u2028",
        reason="attempts exhausted",
        deadline=INT64_MAX,
    )
    records: list[dict[str, Any]] = [{"key": b"\xff", "value": b"\x00", "headers": extreme}]
    records += [
        {
            "key": f"k{i}".encode(),
            "value": f'{{"n": {i}}}'.encode(),
            "headers": request_headers(
                topic, now_ms(), send_to="dlq", group="billing", error_message=f"said {i}"
            ),
        }
        for i in range(3)
    ]
    # Pending 1 to 3: one key's queue (ordering="key"), its head due in an hour and
    # two records behind it, so that the queue views and the 409 of a held row are
    # fuzzed too.
    records += [
        {
            "key": b"p",
            "value": b"later",
            "headers": request_headers(
                topic,
                now_ms() + 3_600_000,
                group="billing",
                attempt=1 if i == 0 else 0,
                original_topic=topic,
                original_partition=0,
                original_offset=i,
                order="key" if i == 0 else "behind",
            ),
        }
        for i in range(3)
    ]
    produce(bootstrap, service.settings.requests_topic, records)
    deadline = Deadline(30)
    while len(dead_letters(service.database_url)) < 4 and not deadline.passed():
        time.sleep(0.1)
    assert len(dead_letters(service.database_url)) >= 4


@pytest.fixture(scope="module")
def fuzzed(bootstrap: str, database_url: str) -> Iterator[Fuzzed]:
    topic = create_topic(bootstrap)
    settings = settings_for(
        bootstrap,
        fresh_database(database_url),
        allowed_destinations=[topic],
        replay_rate_per_second=5000,
    )
    with running_service(settings) as service:
        seed_through_kafka(bootstrap, service, topic)
        seed_extremes(service.database_url)
        operator = {"Authorization": f"Bearer {service.tokens.create('fuzz-op', 'operator')}"}
        viewer = {"Authorization": f"Bearer {service.tokens.create('fuzz-viewer', 'viewer')}"}
        yield Fuzzed(service, f"http://127.0.0.1:{service.http_port}", topic, operator, viewer)


def _time(value: object) -> datetime | None:
    try:
        at = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _inverted_time_range(case: Case) -> bool:
    """`until` not after `since`: refused by a rule JSON Schema cannot state."""
    found = [case.query or {}]
    if isinstance(case.body, dict) and isinstance(case.body.get("filter"), dict):
        found.append(case.body["filter"])
    for where in found:
        since, until = _time(where.get("since")), _time(where.get("until"))
        if since is not None and until is not None and until <= since:
            return True
    return False


def _int64_bound(response: Response) -> bool:
    """A number just past an int64 bound: JSON Schema validators compare numbers as
    doubles, in which 2**63 - 1 and 2**63 + 191 are the same; the handler is exact."""
    return any(f"than or equal to {bound}" in response.text for bound in (INT64_MAX, INT64_MIN))


@schemathesis.check
def schema_valid_input_is_not_refused(
    ctx: CheckContext, response: Response, case: Case
) -> bool | None:
    """Input the document calls valid is never refused as malformed (422): the
    document refuses what the handlers refuse. (400 remains a refusal of a valid
    request: a cursor this API did not issue, a destination outside the allowlist.)"""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 422:
        return None
    if _inverted_time_range(case) or _int64_bound(response):
        return None
    raise AssertionError(f"schema-valid input refused with 422: {response.text[:500]}")


@dataclass
class Finding:
    operation: str
    check: str
    message: str
    reproduce: str

    def __str__(self) -> str:
        return f"{self.operation}: {self.check}: {self.message}\n{self.reproduce}"


def run_schemathesis(
    fuzzed: Fuzzed, headers: dict[str, str], run: RoleRun
) -> tuple[list[Finding], int]:
    """One schemathesis run (the fuzzing phase, the coverage phase if ``run`` says so)
    with these headers: what failed, and how many cases were checked."""
    generation = {**SCHEMATHESIS_CONFIG["generation"], "max-examples": run.examples}
    phases = {**SCHEMATHESIS_CONFIG["phases"], "coverage": {"enabled": run.coverage}}
    config = SchemathesisConfig.from_dict(
        {
            **SCHEMATHESIS_CONFIG,
            "generation": generation,
            "phases": phases,
            "base-url": fuzzed.base_url,
            "headers": headers,
        }
    )
    schema = schemathesis.openapi.from_url(f"{fuzzed.base_url}/openapi.json", config=config)
    findings: list[Finding] = []
    checked = 0
    for event in from_schema(schema).execute():
        if isinstance(event, ScenarioFinished | FuzzScenarioFinished):
            for nodes in event.recorder.checks.values():
                checked += 1
                for node in nodes:
                    if node.status == Status.FAILURE and node.failure_info is not None:
                        info = node.failure_info
                        findings.append(
                            Finding(
                                event.recorder.label,
                                node.name,
                                str(info.failure.message)[:600],
                                info.code_sample[:1500],
                            )
                        )
        elif isinstance(event, NonFatalError | FatalError):
            findings.append(Finding(getattr(event, "label", "-"), "error", repr(event), ""))
    return findings, checked


@pytest.mark.parametrize("role", ["anonymous", "viewer", "operator"])
def test_api_answers_as_documented_and_never_5xx(fuzzed: Fuzzed, role: str) -> None:
    headers = {"anonymous": {}, "viewer": fuzzed.viewer, "operator": fuzzed.operator}[role]
    started = time.monotonic()
    findings, checked = run_schemathesis(fuzzed, headers, RUNS[role])
    print(f"schemathesis as {role}: {checked} cases in {time.monotonic() - started:.1f} s")
    assert checked > 100, "schemathesis generated next to nothing"
    unique = {(f.operation, f.check, f.message): f for f in findings}
    assert not unique, f"{len(unique)} findings:\n\n" + "\n\n".join(str(f) for f in unique.values())
    if role == "operator":
        # The operator run deletes and replays: put the extreme rows back for the
        # tests that follow.
        seed_extremes(fuzzed.service.database_url)


# ------------------------------------------------------------------ the web UI

SURROGATE = "%ED%A0%80"  # a lone surrogate in UTF-8 form: not valid UTF-8
HOSTILE = [
    "%00",
    "a%00b",
    SURROGATE,
    "%FF%FE",
    "9" * 40,
    "-" + "9" * 40,
    str(INT64_MAX),
    str(INT64_MIN),
    "0001-01-01T00:00:00%2B23:59",
    "9999-12-31T23:59:59-23:59",
    "2020-01-01T00:00:00",
    "x" * 3000,
    "%25%5C_",
]
UI_PARAMS = [
    ("/dead-letters", name)
    for name in ("topic", "group", "error_type", "text", "reason", "since", "until", "cursor")
] + [
    ("/pending", "destination"),
    ("/pending", "group"),
    ("/pending", "cursor"),
    ("/", "back"),
    ("/login", "next"),
    ("/dead-letters/1", "back"),
    ("/pending/1/queue", "cursor"),
    ("/pending/2/queue", "back"),
    ("/error-groups", "topic"),
    ("/error-groups", "order"),
    ("/error-groups", "muted"),
    ("/error-groups/0123456789abcdef", "cursor"),
]


def web_clients(fuzzed: Fuzzed) -> list[httpx.Client]:
    """An anonymous browser and one signed in with the operator token."""
    session = fuzzed.operator["Authorization"].removeprefix("Bearer ")
    return [
        httpx.Client(base_url=fuzzed.base_url, timeout=30),
        httpx.Client(base_url=fuzzed.base_url, timeout=30, cookies={"redrive_session": session}),
    ]


@pytest.mark.parametrize(("page", "param"), UI_PARAMS, ids=[f"{p}?{n}" for p, n in UI_PARAMS])
def test_ui_pages_survive_hostile_query_values(fuzzed: Fuzzed, page: str, param: str) -> None:
    for web in web_clients(fuzzed):
        with web:
            for value in HOSTILE:
                response = web.get(f"{page}?{param}={value}")
                assert response.status_code < 500, (page, param, value, response.text[:300])


def test_ui_pages_show_every_seeded_row(fuzzed: Fuzzed) -> None:
    """Every dead letter and the pending page render, extreme values included."""
    with httpx.Client(base_url=fuzzed.base_url, timeout=30) as web:
        for row in dead_letters(fuzzed.service.database_url):
            page = web.get(f"/dead-letters/{row['id']}")
            assert page.status_code == 200, (row["id"], page.text[:300])
        for path in (
            "/",
            "/pending",
            "/dead-letters",
            "/pending?cursor=" + "A" * 50,
            "/error-groups",
        ):
            assert web.get(path).status_code == 200, path


@pytest.mark.parametrize(
    "fields",
    [
        {"op": "delete:matching", "text": "a\x00b"},
        {"op": "replay:matching", "topic": "\x00", "all": "1", "confirmed": "1"},
        {"op": "delete:matching", "since": "9999-12-31T23:59:59-23:59", "confirmed": "1"},
        {"op": "delete:selected", "ids": str(INT64_MAX + 1), "confirmed": "1"},
        {"op": "replay:selected", "ids": "0", "confirmed": "1"},
    ],
)
def test_ui_forms_survive_hostile_values(fuzzed: Fuzzed, fields: dict[str, str]) -> None:
    csrf = "c" * 43  # any token of the right shape: the cookie and the field must agree
    session = fuzzed.operator["Authorization"].removeprefix("Bearer ")
    cookies = {"redrive_csrf": csrf, "redrive_session": session}
    with httpx.Client(base_url=fuzzed.base_url, timeout=30, cookies=cookies) as web:
        response = web.post(
            "/dead-letters/bulk", data={**fields, "csrf": csrf, "back": "/dead-letters"}
        )
        assert response.status_code < 500, (fields, response.text[:300])
