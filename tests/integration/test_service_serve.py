"""`redrive serve` as an operator runs it: embedded default, endpoints, bad settings."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from redrive.deadlines import Deadline
from redrive.local import LocalStack
from tests.integration.consumer_harness import wait_for
from tests.integration.service_harness import Collector, now_ms, produce, request_headers

pytestmark = pytest.mark.integration


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_serve_without_settings_uses_the_local_stack_and_says_where_it_listens(
    local_stack: LocalStack, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    # The only environment: where the local stack lives (as after `redrive local up`),
    # and any free HTTP port, since 8080 may be taken on a shared machine.
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDRIVE_")}
    env.update(REDRIVE_STATE_DIR=str(local_stack.root), REDRIVE_HTTP_PORT="0")
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "redrive.cli", "serve"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = Deadline(60)
        match = None
        while match is None and not deadline.passed() and proc.poll() is None:
            match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", log_path.read_text())
            time.sleep(0.1)
        assert match, log_path.read_text()
        base = match.group(1)
        text = log_path.read_text()
        status = local_stack.status()
        assert f"kafka {status.bootstrap}" in text
        assert "requests topic redrive.requests" in text
        assert status.database_url.split("@")[1] in text  # the embedded PostgreSQL
        assert ":***@" in text and local_stack.postgres().password not in text

        assert http_get(f"{base}/healthz")[0] == 200
        code, body = http_get(f"{base}/readyz")
        assert code == 200, body

        destination = new_topic("served")
        collector = Collector(status.bootstrap, destination)
        produce(
            status.bootstrap,
            "redrive.requests",
            [{"key": b"k", "value": b"v", "headers": request_headers(destination, now_ms() + 300)}],
        )
        assert len(collector.poll_until(1, 20)) == 1
        collector.close()
        published = f'redrive_retries_published_total{{destination="{destination}"}}'

        def counted(metrics: str) -> bool:
            return (
                metric(metrics, "redrive_requests_received_total") >= 1
                and metric(metrics, "redrive_requests_scheduled_total") >= 1
                and metric(metrics, published) == 1
                and metric(metrics, "redrive_retry_lateness_seconds_count") >= 1
            )

        # Counted once the delivery's outcome is recorded, which may be after it arrived.
        wait_for(lambda: counted(http_get(f"{base}/metrics")[1]), 30)
        _, metrics = http_get(f"{base}/metrics")
        assert metric(metrics, "redrive_requests_received_total") >= 1
        assert metric(metrics, "redrive_requests_scheduled_total") >= 1
        assert metric(metrics, published) == 1
        assert metric(metrics, "redrive_retry_lateness_seconds_count") >= 1
        assert "redrive_pending" in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0, log_path.read_text()[-2000:]
    assert "intake stopped" in log_path.read_text()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"REDRIVE_INTAKE_BATCH_SIZE": "0"}, "intake_batch_size (REDRIVE_INTAKE_BATCH_SIZE)"),
        ({"REDRIVE_REQUESTS_TOPIC": "bad topic!"}, "requests_topic (REDRIVE_REQUESTS_TOPIC)"),
        ({"REDRIVE_ROLES": '["intake", "juggler"]'}, "roles"),
        ({"REDRIVE_WORKERS": "0"}, "workers (REDRIVE_WORKERS)"),
        ({"REDRIVE_PARTITIONER": "crc32"}, "partitioner (REDRIVE_PARTITIONER)"),
        ({"REDRIVE_KAFKA": '{"partitioner": "random"}'}, "kafka (REDRIVE_KAFKA)"),
        ({"REDRIVE_ALLOWED_DESTINATIONS": '["ok", "no spaces"]'}, "allowed_destinations"),
        ({"REDRIVE_INGEST": '[{"topic": "no spaces!"}]'}, "ingest.0.topic (REDRIVE_INGEST)"),
        ({"REDRIVE_INGEST": '[{"topic": "t", "format": "xml"}]'}, "ingest.0.format"),
        (
            {"REDRIVE_INGEST": '[{"topic": "^redrive\\\\.req.*"}]'},
            "names the requests topic 'redrive.requests'",
        ),
        (
            {
                "REDRIVE_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
                "REDRIVE_BOOTSTRAP": "127.0.0.1:1",
            },
            "database_url (REDRIVE_DATABASE_URL)",
        ),
    ],
)
def test_a_bad_setting_stops_start_up_naming_it(env: dict[str, str], expected: str) -> None:
    assert_refused(env, (), expected)


def test_a_bad_partitioner_option_stops_start_up_naming_it() -> None:
    assert_refused({}, ("--partitioner", "crc32"), "partitioner (REDRIVE_PARTITIONER)")


def assert_refused(env: dict[str, str], args: tuple[str, ...], expected: str) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REDRIVE_")}
    # Any free HTTP port: 8080 may be taken (another test's service), and a taken port
    # is refused first, naming that setting instead.
    result = subprocess.run(
        [sys.executable, "-m", "redrive.cli", "serve", *args],
        env={**clean, "REDRIVE_HTTP_PORT": "0", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


def test_a_yaml_file_with_an_unknown_key_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "redrive.yaml"
    config.write_text("requests_topic: retries\nallowed_destnations: [orders]\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REDRIVE_")}
    result = subprocess.run(
        [sys.executable, "-m", "redrive.cli", "serve", "--config", str(config)],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "allowed_destnations" in result.stderr
    assert "Extra inputs are not permitted" in result.stderr


def test_the_service_itself_never_starts_the_dev_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only `redrive serve` falls back to the local stack; the service needs addresses."""
    from redrive.errors import ConfigError
    from redrive.service.config import ServiceSettings
    from redrive.service.service import RetryService

    state = tmp_path / "state"
    monkeypatch.setenv("REDRIVE_STATE_DIR", str(state))
    for missing in ({"bootstrap": None}, {"database_url": None}):
        values = {"bootstrap": "127.0.0.1:1", "database_url": "postgresql://x@127.0.0.1:1/x"}
        settings = ServiceSettings(**{**values, **missing, "http_port": 0})
        service = RetryService(settings)
        with pytest.raises(ConfigError) as info:
            service.start()
        service.stop()
        assert info.value.setting.startswith(next(iter(missing)))
    assert not state.exists()
