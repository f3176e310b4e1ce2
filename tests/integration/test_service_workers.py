"""`redrive serve` with workers: whole services as processes side by side, started,
watched and stopped as one, with one HTTP endpoint whose metrics count them all."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from redrive.errors import ConfigError
from redrive.service.migrations import _LOCK_ID
from redrive.service.workers import Worker
from tests.integration.consumer_harness import wait_for
from tests.integration.service_harness import (
    Collector,
    ServiceProcess,
    fresh_database,
    now_ms,
    produce,
    request_headers,
    settings_for,
    wait_until,
)
from tests.integration.test_service_serve import http_get, metric


def _http_base(log: Path) -> str:
    found = re.search(r"listening on (http://[0-9.]+:\d+)", log.read_text(errors="replace"))
    assert found, log.read_text()[-2000:]
    return found.group(1)


def test_workers_share_the_work_count_as_one_and_end_together(
    bootstrap: str, database_url: str, new_topic: object, tmp_path: Path
) -> None:
    destination = new_topic("dest", 3)  # type: ignore[operator]
    settings = settings_for(
        bootstrap,
        fresh_database(database_url),
        allowed_destinations=[destination],
        workers=2,
    )
    log = tmp_path / "serve.log"
    serve = ServiceProcess(settings, log)
    serve.start()
    collector = Collector(bootstrap, destination)
    try:
        assert serve.proc is not None
        children = psutil.Process(serve.proc.pid).children()
        assert len(children) == 1
        n = 2_000
        due = now_ms()
        produce(
            bootstrap,
            settings.requests_topic,
            [
                {
                    "key": str(i).encode(),
                    "value": b"v%d" % i,
                    "headers": request_headers(destination, due),
                }
                for i in range(n)
            ],
        )
        got = collector.poll_until(n, 90)
        assert sorted(d.value for d in got) == sorted(b"v%d" % i for i in range(n))
        # Both took part: two members of the intake group, and the one /metrics counts
        # what each stored (neither alone holds all six request partitions).
        admin = AdminClient({"bootstrap.servers": bootstrap})
        group = admin.describe_consumer_groups([settings.group_id])[settings.group_id].result()
        assert len(group.members) == 2
        base = _http_base(log)
        wait_until(
            lambda: metric(http_get(f"{base}/metrics")[1], "redrive_requests_scheduled_total") == n,
            10,
            "the scheduled count of both workers",
        )
        published = f'redrive_retries_published_total{{destination="{destination}"}}'
        # Counted once each batch's outcome is recorded, which may be after its delivery.
        wait_for(lambda: metric(http_get(f"{base}/metrics")[1], published) == n, 30)
        assert metric(http_get(f"{base}/metrics")[1], published) == n
        assert '"worker": 1' in log.read_text()  # the child's log lines say which it is

        # A worker that dies takes the service down, loudly, for its supervisor.
        children[0].send_signal(signal.SIGKILL)
        assert serve.proc.wait(30) == 1
        assert "a worker ended" in log.read_text()

        # A parent that is SIGKILLed leaves no worker behind (started as the docs do).
        one = settings.model_copy(update={"workers": 1})
        serve = ServiceProcess(one, tmp_path / "again.log", args=("--workers", "2"))
        serve.start()
        assert serve.proc is not None
        child = psutil.Process(serve.proc.pid).children()[0]
        serve.kill()
        wait_until(
            lambda: not child.is_running() or child.status() == "zombie", 30, "the worker ends"
        )
    finally:
        collector.close()
        if serve.alive():
            serve.terminate()


def test_a_worker_that_cannot_start_stops_start_up_naming_the_setting(
    bootstrap: str, database_url: str
) -> None:
    # A store newer than this redrive: the worker refuses it at once (exit code 2).
    url = fresh_database(database_url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE redrive_schema_migrations (version integer, name text)")
        conn.execute("INSERT INTO redrive_schema_migrations VALUES (999, 'from_the_future')")
    worker = Worker(settings_for(bootstrap, url, workers=2), 1)
    with pytest.raises(ConfigError) as refused:
        worker.wait_started()
    assert refused.value.setting == "workers (REDRIVE_WORKERS)"
    assert "worker 1 ended before it started (exit code 2)" in refused.value.problem


# A `redrive serve` reduced to what matters here: it starts one worker and waits.
PARENT = """
import sys, time
from redrive.service.config import ServiceSettings
from redrive.service.workers import Worker
Worker(ServiceSettings.model_validate_json(sys.stdin.read()), 1)
time.sleep(600)
"""


def test_a_worker_whose_parent_is_killed_while_it_starts_stops(
    bootstrap: str, database_url: str
) -> None:
    url = fresh_database(database_url)
    settings = settings_for(bootstrap, url, workers=2)
    with psycopg.connect(url, autocommit=True) as holder:
        # The schema's migration lock held: the worker's start-up waits for it.
        holder.execute("SELECT pg_advisory_lock(%s)", (_LOCK_ID,))
        parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, text=True)
        worker: psutil.Process | None = None
        try:
            assert parent.stdin is not None
            parent.stdin.write(settings.model_dump_json())
            parent.stdin.close()

            def waiting_for_the_lock() -> bool:
                row = holder.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory'"
                ).fetchone()
                return row is not None and row[0] == 1

            wait_until(waiting_for_the_lock, 60, "the worker waits for the migration lock")
            [worker] = psutil.Process(parent.pid).children()
            assert "serve-worker" in worker.cmdline()
            parent.kill()
            parent.wait(10)
            wait_until(
                lambda: not worker.is_running() or worker.status() == "zombie",
                30,
                "the starting worker ends once its parent is gone",
            )
        finally:
            parent.kill()
            parent.wait(10)
            if worker is not None and worker.is_running():
                worker.kill()
