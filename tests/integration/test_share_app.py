"""redrive on a share group (KIP-932), against the real broker and retry service:
consumers share one partition's records, retries come back when due, never before,
and a fatal error is a dead letter with its raw key and value."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import httpx
import pytest

from redrive import FatalError, Message, ShareApp
from tests.integration.consumer_harness import a_group, retry_service, running_app, wait_for
from tests.integration.service_harness import produce
from tests.integration.share_harness import Calls, read_from_start

pytestmark = pytest.mark.integration

CONSUMERS = 4
POLICY = "0s, 1s, 3s"


class Flaky(Exception):
    pass


def handler_for(name: str, calls: Calls) -> Callable[[Message], None]:
    def handle(message: Message) -> None:
        calls.add(name, message)
        value = message.raw_value or b""
        if value.startswith(b"fatal"):
            raise FatalError("order cannot exist")
        if value.startswith(b"retry") and message.attempt <= 3:
            raise Flaky(f"attempt {message.attempt}")

    return handle


@contextmanager
def share_apps(
    bootstrap: str, group: str, topic: str, requests_topic: str, calls: Calls
) -> Iterator[list[ShareApp]]:
    apps = []
    with ExitStack() as stack:
        for index in range(CONSUMERS):
            app = ShareApp(bootstrap, group=group, requests_topic=requests_topic)
            app.add_handler(topic, handler_for(f"c{index}", calls), policy=POLICY)
            apps.append(stack.enter_context(running_app(app)))
        yield apps


def test_share_consumers_share_records_and_retries_come_back_when_due(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("share", partitions=1)
    group = a_group()
    read_from_start(bootstrap, group)
    ok = [b"ok-%03d" % i for i in range(200)]
    retried = [b"retry-%d" % i for i in range(8)]
    fatal = [b"fatal-%d" % i for i in range(2)]
    produce(
        bootstrap,
        topic,
        [{"key": b"k-" + value, "value": value} for value in [*ok, *retried, *fatal]],
    )
    calls = Calls()
    with retry_service(bootstrap, database_url, allowed_destinations=[topic]) as service:
        requests_topic = service.settings.requests_topic
        with (
            share_apps(bootstrap, group, topic, requests_topic, calls),
            httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as api,
        ):

            def done() -> bool:
                seen = calls.by_value()
                return all(len(seen.get(v, [])) >= 4 for v in retried) and all(
                    v in seen for v in ok
                )

            assert wait_for(done, 120), {v: len(c) for v, c in calls.by_value().items()}

            def letters() -> list[dict[str, object]]:
                items: list[dict[str, object]] = api.get(
                    "/api/v1/dead-letters", params={"topic": topic}
                ).json()["items"]
                return items

            assert wait_for(lambda: len(letters()) == len(fatal), 30), letters()
            details = [api.get(f"/api/v1/dead-letters/{item['id']}").json() for item in letters()]
            wait_for(lambda: False, 2)  # nothing more comes
    seen = calls.by_value()
    # Shared: more than one consumer of the group took records of the one partition.
    assert len(calls.consumers()) >= 2, calls.consumers()
    assert all(len(seen[v]) == 1 for v in ok), "a record handled twice"
    for value in retried:
        tries = seen[value]
        assert [c.attempt for c in tries] == [1, 2, 3, 4], tries
        # Due at once: released to the group, delivered again (count 2, no hand-off).
        assert tries[1].delivery_count == 2 and tries[1].retry_at is None
        # Due in 1 s, then 3 s: through the retry service, never before due.
        for before, after, delay_ms in ((tries[1], tries[2], 1000), (tries[2], tries[3], 3000)):
            assert after.retry_at is not None and after.at_ms >= after.retry_at
            assert after.at_ms - before.at_ms >= delay_ms, (before, after)
    for value in fatal:
        assert [c.attempt for c in seen[value]] == [1]
    stored = {base64.b64decode(d["value"]["base64"]): d for d in details}
    assert set(stored) == set(fatal)
    for value, letter in stored.items():
        assert base64.b64decode(letter["key"]["base64"]) == b"k-" + value
        assert letter["reason_code"] == "fatal_error", letter
