"""A share group's consumers when one dies or a handler outlives its lock: what was
acquired comes back to the others, nothing is lost, and a hand-off is stored once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from redrive import Message, ShareApp
from tests.integration.consumer_harness import a_group, retry_service, running_app, wait_for
from tests.integration.service_harness import produce
from tests.integration.share_harness import Calls, read_from_start

pytestmark = pytest.mark.integration

PROCESS = Path(__file__).with_name("share_process.py")


def events(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_a_consumer_killed_mid_record_loses_nothing_and_hands_off_once(
    bootstrap: str, database_url: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic("share-kill", partitions=1)
    group = a_group()
    read_from_start(bootstrap, group, lock_ms=3000)
    values = [b"retry-%03d" % i if i % 5 == 0 else b"ok-%03d" % i for i in range(200)]
    produce(bootstrap, topic, [{"key": v, "value": v} for v in values])
    out = tmp_path / "events.jsonl"
    calls = Calls()

    def handle(message: Message) -> None:
        calls.add("survivor", message)
        if (message.raw_value or b"").startswith(b"retry") and message.retry is None:
            raise RuntimeError("downstream unavailable")

    with retry_service(bootstrap, database_url, allowed_destinations=[topic]) as service:
        requests_topic = service.settings.requests_topic
        args = [sys.executable, str(PROCESS), bootstrap, topic, group, requests_topic, str(out)]
        process = subprocess.Popen(args, env={**os.environ}, stdout=subprocess.DEVNULL)
        try:
            blocked = wait_for(lambda: any(e["event"] == "blocked" for e in events(out)), 90)
            assert blocked, events(out)
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(30)
        died = events(out)
        [stuck] = [e for e in died if e["event"] == "blocked"]
        [failed] = [e for e in died if e["event"] == "fail"]
        with ExitStack() as stack:
            for _ in range(3):
                app = ShareApp(bootstrap, group=group, requests_topic=requests_topic)
                app.add_handler(topic, handle, policy="1s x3")
                stack.enter_context(running_app(app))

            def handled_well(value: bytes) -> bool:
                tries = calls.by_value().get(value, [])
                if value.startswith(b"retry"):
                    return any(c.retry_at is not None for c in tries)
                return bool(tries)

            def all_done() -> bool:
                killed_ok = {str(e["value"]).encode() for e in died if e["event"] == "ok"}
                return all(v in killed_ok or handled_well(v) for v in values)

            assert wait_for(all_done, 120), "a record was lost"
            wait_for(lambda: False, 3)  # what would come twice comes by now
    seen = calls.by_value()
    # What the dead consumer held came back to the others, its delivery count + 1.
    for held in (stuck, failed):
        again = seen[str(held["value"]).encode()]
        assert again[0].delivery_count is not None
        assert again[0].delivery_count >= int(str(held["delivery_count"])) + 1, again
    # Each hand-off visible once: the failure the dead consumer handed off (maybe) and
    # the survivor handed off again with the same id came back from the service once.
    for value in values:
        if value.startswith(b"retry"):
            redelivered = [c for c in seen.get(value, []) if c.retry_at is not None]
            assert len(redelivered) == 1, (value, redelivered)


def test_an_async_handler_on_a_share_group_handles_each_record_once_on_success(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("share-async", partitions=1)
    group = a_group()
    read_from_start(bootstrap, group)
    values = [b"v-%04d" % i for i in range(1000)]
    failing = set(values[::10])
    produce(bootstrap, topic, [{"value": v} for v in values])
    succeeded: list[bytes] = []
    lock = threading.Lock()
    calls = Calls()

    async def handle(message: Message) -> None:
        calls.add("a", message)
        await asyncio.sleep(0.001)
        value = message.raw_value or b""
        if value in failing and message.attempt <= 2:
            raise RuntimeError(f"attempt {message.attempt}")
        with lock:
            succeeded.append(value)

    with (
        retry_service(bootstrap, database_url, allowed_destinations=[topic]) as service,
        ExitStack() as stack,
    ):
        for _ in range(2):
            app = ShareApp(bootstrap, group=group, requests_topic=service.settings.requests_topic)
            app.add_handler(topic, handle, policy="0s x2")
            stack.enter_context(running_app(app))
        assert wait_for(lambda: len(succeeded) >= len(values), 120), len(succeeded)
        wait_for(lambda: False, 2)  # nothing more comes
    assert sorted(succeeded) == values, "a record handled twice, or not at all"
    for value in failing:
        tries = calls.by_value()[value]
        assert [c.attempt for c in tries] == [1, 2, 3]
        assert [c.delivery_count for c in tries] == [1, 2, 3]  # released twice


def test_a_handler_outliving_its_lock_is_released_before_the_lock_runs_out(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("share-lock", partitions=1)
    group = a_group()
    read_from_start(bootstrap, group, lock_ms=2000)
    produce(bootstrap, topic, [{"value": b"slow"}, {"value": b"quick"}])
    calls = Calls()

    async def handle(message: Message) -> None:
        calls.add("a", message)
        if message.raw_value == b"slow" and message.delivery_count == 1:
            await asyncio.sleep(30)  # far past the 2 s lock: cancelled at 1.8 s

    with retry_service(bootstrap, database_url, allowed_destinations=[topic]) as service:
        app = ShareApp(
            bootstrap,
            group=group,
            requests_topic=service.settings.requests_topic,
            metrics_port=0,
        )
        app.add_handler(topic, handle)
        with running_app(app):
            assert wait_for(lambda: len(calls.by_value().get(b"slow", [])) >= 2, 60)
            wait_for(lambda: False, 1)
            assert app.health_url is not None and app.metrics_url is not None
            health = httpx.get(app.health_url, timeout=10)
            exposed = httpx.get(app.metrics_url, timeout=10).text
    tries = calls.by_value()[b"slow"]
    assert [c.delivery_count for c in tries] == [1, 2], tries
    assert health.status_code == 200 and health.json()["group"] == group
    released = f'redrive_share_lock_released_total{{topic="{topic}"}} 1.0'
    assert released in exposed, exposed
    assert f'redrive_share_acknowledgements_total{{topic="{topic}",type="release"}} 1.0' in exposed
    assert [c.attempt for c in calls.by_value()[b"quick"]] == [1]
