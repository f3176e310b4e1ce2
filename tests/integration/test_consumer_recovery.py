"""An App restarted after a crash gets its partitions back in seconds, not after the
broker's session timeout: static group membership (`App(instance_id=...)`).

Without it, a restarted App is a new member, and the killed one's partitions stay
assigned to the dead member until the broker expires it (`session.timeout.ms`, 45 s
by default, as here). With a stable instance id, the broker hands the new process
the old one's assignment at once. Two live Apps on one id: the older one stops with
an error naming the setting, instead of idling as a fenced consumer.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chaos.harness import AppProcess
from tests.integration.service_harness import produce, wait_until

pytestmark = pytest.mark.integration

SESSION_TIMEOUT_MS = "45000"  # librdkafka's default, what a user gets
RESTART_BOUND_S = 10.0  # well under the session timeout


def test_a_killed_app_restarted_with_its_instance_id_resumes_at_once(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic("recover", partitions=4)
    app = AppProcess(
        bootstrap,
        topic,
        "blocking",
        f"recover-{uuid.uuid4().hex[:8]}",
        "redrive.requests",
        tmp_path,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        instance_id=f"app-{uuid.uuid4().hex[:8]}",
    )
    first = [f"a{i}".encode() for i in range(40)]
    second = [f"b{i}".encode() for i in range(40)]
    app.start()
    try:
        produce(bootstrap, topic, [{"key": v, "value": v} for v in first])
        wait_until(lambda: set(first) <= app.handled().keys(), 60, "the first records")
        app.kill()
        app.start()
        restarted = time.monotonic()
        produce(bootstrap, topic, [{"key": v, "value": v} for v in second])
        wait_until(lambda: set(second) <= app.handled().keys(), 40, "the records after the restart")
        resumed_s = time.monotonic() - restarted
    finally:
        app.terminate()
    print(f"all partitions back and handled {resumed_s:.1f} s after the restart")
    # Every partition delivered again (the keys spread over all four), long before the
    # broker would have expired the killed member.
    assert resumed_s < RESTART_BOUND_S, app.log_tail()
    assert app.handled().keys() >= set(first) | set(second)


def test_two_apps_on_one_instance_id_stop_the_older_naming_the_setting(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic("fenced", partitions=2)
    group, instance = f"fenced-{uuid.uuid4().hex[:8]}", f"app-{uuid.uuid4().hex[:8]}"

    def process(folder: str) -> AppProcess:
        (tmp_path / folder).mkdir()
        return AppProcess(
            bootstrap, topic, "blocking", group, "redrive.requests", tmp_path / folder,
            instance_id=instance,
        )  # fmt: skip

    older, newer = process("older"), process("newer")
    older.start()
    try:
        produce(bootstrap, topic, [{"key": b"k", "value": b"one"}])
        wait_until(lambda: b"one" in older.handled(), 60, "the first App to handle a record")
        newer.start()
        assert older.proc is not None
        wait_until(lambda: older.proc.poll() is not None, 60, "the older App to stop")
        produce(bootstrap, topic, [{"key": b"k", "value": b"two"}])
        wait_until(lambda: b"two" in newer.handled(), 60, "the newer App to go on")
    finally:
        newer.terminate()
        older.terminate()
    assert older.proc.returncode != 0
    log = older.log_tail(80)
    assert "App(instance_id=...)" in log and "same instance id" in log, log
