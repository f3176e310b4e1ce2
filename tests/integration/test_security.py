"""Who may do what: SASL/SCRAM over TLS, the allowlist, tokens, request limits, SQL."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterator

import httpx
import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from redrive import App, Message
from redrive.local.kafka import LocalKafka
from redrive.local.security import LocalSecurity
from redrive.ports import free_port
from redrive.service.service import RetryService
from tests.integration.consumer_harness import Calls, retry_service, running_app
from tests.integration.service_harness import (
    Collector,
    dead_letters,
    first_replay_of,
    now_ms,
    produce,
    replay_split,
    request_headers,
    wait_until,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A broker of this module's own that accepts only SASL/SCRAM-SHA-512 over TLS."""
    root = tmp_path_factory.mktemp("secure")
    broker = LocalKafka(
        root / "kafka", free_port(), free_port(), security=LocalSecurity(root / "tls")
    )
    broker.start(quiet=True)
    yield broker
    broker.stop()


def test_service_and_library_work_over_sasl_scram_and_tls(
    secure_broker: LocalKafka, database_url: str
) -> None:
    config = secure_broker.client_config()
    security = {k: v for k, v in config.items() if k != "bootstrap.servers"}
    assert security["security.protocol"] == "SASL_SSL"
    topic = f"secure-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(config)  # kept alive until the topic exists
    admin.create_topics([NewTopic(topic, 2)])[topic].result(30)
    calls = Calls()

    def handler(message: Message) -> None:
        calls.add(message)
        if message.attempt == 1:
            raise TimeoutError("first try fails")

    with retry_service(
        secure_broker.bootstrap, database_url, kafka=security, allowed_destinations=[topic]
    ) as service:
        app = App(
            secure_broker.bootstrap,
            group="secure-app",
            kafka=security,
            requests_topic=service.settings.requests_topic,
        )
        app.add_handler(topic, handler, policy="500ms", strategy="service")
        with running_app(app):
            producer = Producer(config)
            producer.produce(topic, key=b"k", value=b"over tls")
            producer.flush(30)
            producer.close()
            assert calls.wait_for(lambda: len(calls.of(b"over tls")) >= 2, 60)
    assert [c.attempt for c in calls.of(b"over tls")] == [1, 2]


def test_a_wrong_password_stops_the_service_with_a_clear_error(
    secure_broker: LocalKafka, database_url: str
) -> None:
    security = secure_broker.security
    assert security is not None
    from redrive.errors import ConfigError
    from tests.integration.service_harness import fresh_database, settings_for

    settings = settings_for(
        secure_broker.bootstrap,
        fresh_database(database_url),
        kafka=security.client_config(password="wrong"),
    )
    service = RetryService(settings)
    with pytest.raises(ConfigError) as info:
        service.start()
    service.stop()
    assert "bootstrap" in info.value.setting
    assert "cannot create or check topic" in info.value.problem
    # The broker's refusal itself, reported as it happens: not a timeout 30 s later.
    assert "authentication" in info.value.problem.lower()


@pytest.fixture
def api_env(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> Iterator[tuple[RetryService, httpx.Client, str, dict[str, str]]]:
    topic = new_topic("sec")
    with retry_service(bootstrap, database_url, allowed_destinations=[topic]) as service:
        produce(
            bootstrap,
            service.settings.requests_topic,
            [
                {
                    "key": b"k",
                    "value": b"v",
                    "headers": request_headers(
                        topic,
                        now_ms(),
                        send_to="dlq",
                        error_type="app.Boom",
                        user_headers=[("mine", b"1")],
                    ),
                },
            ],
        )
        wait_until(lambda: bool(dead_letters(service.database_url)), 20, "the dead letter")
        token = service.tokens.create("sec-operator", "operator")
        with httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as api:
            yield service, api, topic, {"Authorization": f"Bearer {token}"}


def test_tokens_are_stored_hashed_only(
    api_env: tuple[RetryService, httpx.Client, str, dict[str, str]],
) -> None:
    service, _, _, auth = api_env
    token = auth["Authorization"].removeprefix("Bearer ")
    with psycopg.connect(service.database_url) as conn:
        rows = conn.execute("SELECT name, role, token_hash FROM redrive_api_tokens").fetchall()
        dump = str(conn.execute("SELECT * FROM redrive_api_tokens").fetchall())
    assert rows == [("sec-operator", "operator", hashlib.sha256(token.encode()).hexdigest())]
    assert token not in dump


def test_search_parameters_cannot_inject_sql(
    api_env: tuple[RetryService, httpx.Client, str, dict[str, str]],
) -> None:
    service, api, _, _ = api_env
    for attack in ["'; DROP TABLE redrive_dead_letters; --", "%' OR '1'='1", "\\", "_%"]:
        for field in ["topic", "group", "error_type", "text", "reason"]:
            response = api.get("/api/v1/dead-letters", params={field: attack})
            assert response.status_code == 200, (field, attack, response.text)
            assert response.json()["items"] == [], (field, attack)
    assert len(dead_letters(service.database_url)) == 1  # the table is intact


def test_edited_headers_cannot_forge_redrive_metadata(
    api_env: tuple[RetryService, httpx.Client, str, dict[str, str]], bootstrap: str
) -> None:
    _, api, topic, auth = api_env
    (letter,) = api.get("/api/v1/dead-letters").json()["items"]
    collector = Collector(bootstrap, topic)
    forged = [
        {"name": "redrive-destination", "value": {"text": "__consumer_offsets"}},
        {"name": "redrive-attempt", "value": {"text": "99"}},
        {"name": "mine", "value": {"text": "2"}},
    ]
    response = api.post(
        f"/api/v1/dead-letters/{letter['id']}/replay", headers=auth, json={"headers": forged}
    )
    assert response.status_code == 200, response.text
    (arrived,) = collector.poll_until(1, 20)
    collector.close()
    assert replay_split(arrived.headers) == ([("mine", b"2")], first_replay_of(letter["id"]))


def test_oversized_request_bodies_are_refused(
    api_env: tuple[RetryService, httpx.Client, str, dict[str, str]],
) -> None:
    service, api, _, auth = api_env
    limit = service.settings.max_request_bytes
    big = {"ids": [1], "padding": "x" * (limit + 10)}
    declared = api.post("/api/v1/dead-letters/delete", headers=auth, json=big)
    assert declared.status_code == 413
    assert "max_request_bytes" in declared.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"ids": [1], "padding": "'
        for _ in range(limit // 65536 + 2):
            yield b"x" * 65536
        yield b'"}'

    streamed = api.post(
        "/api/v1/dead-letters/delete",
        headers={**auth, "content-type": "application/json"},
        content=chunks(),
    )
    assert streamed.status_code == 413
    assert len(dead_letters(service.database_url)) == 1
