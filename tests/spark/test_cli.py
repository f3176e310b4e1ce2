"""`redrive spark scheduler` as an operator runs it: a process that delivers when due
and stops cleanly on SIGTERM, its options over the environment's settings. Its former
name, `redrive spark-scheduler`, still works."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from redrive.ports import free_port
from redrive.spark.console import is_banner
from tests.integration.consumer_harness import wait_for
from tests.integration.service_harness import Collector, now_ms, produce, request_headers
from tests.spark import scrape

pytestmark = pytest.mark.spark


def test_spark_scheduler_command_delivers_and_stops_on_sigterm(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    destination = new_topic("spark-cli")
    requests_topic = new_topic("spark-cli-requests")
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDRIVE_")}
    # The options win over the environment, which names other topics.
    env.update(
        REDRIVE_BOOTSTRAP=bootstrap,
        REDRIVE_REQUESTS_TOPIC="not-these-requests",
        REDRIVE_ALLOWED_DESTINATIONS='["not-this-destination"]',
    )
    log_path = tmp_path / "spark-scheduler.log"
    metrics_port = free_port()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "redrive.cli",
                "spark",
                "scheduler",
                "--checkpoint",
                str(tmp_path / "checkpoint"),
                *("--requests-topic", requests_topic, "--allow", destination),
                *("--conf", "spark.sql.shuffle.partitions=1"),
                *("--metrics-port", str(metrics_port)),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        # Started: a first micro-batch has run (on a loaded machine the JVM, the session
        # and the first batch's Python workers take minutes); then the delivery's own wait.
        batch_ran = 'redrive_spark_records_total{outcome="read",query="redrive-scheduler"}'
        assert wait_for(lambda: batch_ran in scrape(metrics_port), 300), log_path.read_text()
        collector = Collector(bootstrap, destination)
        due = now_ms() + 3_000
        produce(
            bootstrap,
            requests_topic,
            [{"key": b"k", "value": b"via the CLI", "headers": request_headers(destination, due)}],
        )
        arrived = collector.poll_until(1, 120)
        collector.close()
        assert [d.value for d in arrived] == [b"via the CLI"], log_path.read_text()[-3000:]
        assert arrived[0].received_ms >= due
        # Its metrics: the delivery counted, once its batch's progress is reported.
        delivered = 'redrive_spark_records_total{outcome="delivered",query="redrive-scheduler"}'
        assert wait_for(lambda: f"{delivered} 1.0" in scrape(metrics_port), 60), scrape(
            metrics_port
        )
        scraped = scrape(metrics_port)
        assert 'redrive_spark_query_up{query="redrive-scheduler"} 1.0' in scraped
    finally:
        before = log_path.read_bytes()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    output = log_path.read_text()
    assert code == 0, output[-3000:]
    assert f"requests topic {requests_topic}" in output
    # Quiet: no banner of a process Spark started; the stop says one line, no stack.
    assert not [line for line in output.splitlines() if is_banner(line)]
    assert not [line for line in output.splitlines() if line.startswith("\tat ")], output
    after = log_path.read_bytes()[len(before) :].decode().splitlines()
    # (a warning Spark wrote just before the signal may still be on its way)
    assert [line for line in after if " WARN " not in line] == [
        "redrive spark scheduler: stopped"
    ], after


def test_the_former_name_spark_scheduler_is_the_same_command() -> None:
    def help_of(*command: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "redrive.cli", *command, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return result.stdout

    # The same options and text; only the usage line names the command differently.
    assert help_of("spark-scheduler") == help_of("spark", "scheduler").replace(
        "spark scheduler", "spark-scheduler"
    )
    assert "spark-scheduler" not in help_of()  # hidden: the docs name `redrive spark scheduler`


def test_a_negative_restarts_is_refused_before_spark_starts(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "redrive.cli", "spark", "scheduler"]
        + ["--checkpoint", str(tmp_path / "ckpt"), "--restarts", "-1"]
        + ["--bootstrap", "127.0.0.1:9"],  # no broker: the check needs none
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("redrive: --restarts: -1 is not a number of restarts")
    assert "log4j" not in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "ckpt").exists()
