"""Key order through the retry service with per-group retry topics, under a backlog.

With ``Service(ordering="key", per_group_topic=False)`` a retry is delivered back to
its source partition, at the end of it: behind a backlog, a "1s" retry waits until
the backlog before it is handled. With ``Service(ordering="key")`` (its default
``per_group_topic=True``) it comes back on ``<group>.<topic>.retry`` instead, on the
partition of its source record's number, which the App reads beside the source: it
is handled when due while the backlog drains, and the later records of its key still
wait behind it.

The App is docs/consumer.md's example ("Key order without waiting behind the
backlog"): its strategy and its bound on what the consumer fetches ahead, without
which a due retry waits behind the fetched part of the backlog. The backlog's handling
takes a known least time (each of its records sleeps), so that it is still draining
when the retries are due, however fast the machine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from redrive import App, Message, Service
from redrive.clock import now_ms
from redrive.topic_names import per_group_retry_topic
from tests.integration.consumer_harness import (
    CONSUMER_DOC,
    a_group,
    docs_example,
    retry_service,
    running_app,
    wait_for,
)
from tests.integration.service_harness import produce

pytestmark = pytest.mark.integration

BACKLOG = 100_000
PARTITIONS = 2
PROBES = 20
"""Keys whose second record fails once, each with a record before and after it, and
one more in the middle of the backlog."""
BACKLOG_SLEEP_S = 0.0001
"""Each backlog record's least handling time: 100,000 of them take at least 10 s."""


class Handled:
    """What the handler did, in order (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_key: dict[bytes, list[bytes]] = {}
        self.backlog = 0
        self.late_ms: list[int] = []
        """For each retry: how long after its due time it was handled."""
        self.backlog_left_at_retry: list[int] = []
        """For each retry: how many backlog records were not handled yet."""

    def handle(self, message: Message) -> None:
        key, value = message.key, message.raw_value
        assert key is not None and value is not None
        if key == b"backlog":
            time.sleep(BACKLOG_SLEEP_S)
            with self.lock:
                self.backlog += 1
            return
        if value.endswith(b"-fails-once") and message.attempt == 1:
            raise ConnectionError("the warehouse is not answering")
        with self.lock:
            if message.retry is not None and message.attempt == 2:
                self.late_ms.append(now_ms() - message.retry.retry_at)
                self.backlog_left_at_retry.append(BACKLOG - self.backlog)
            self.by_key.setdefault(key, []).append(value)


def docs_app() -> App:
    """The docs example's App, registered and not run."""
    source = docs_example("### Key order without waiting behind the backlog", {})
    namespace: dict[str, object] = {}
    exec(compile(source, str(CONSUMER_DOC), "exec"), namespace)
    app = namespace["app"]
    assert isinstance(app, App)
    return app


def records() -> list[dict[str, object]]:
    """Each probe key's first three records, then the backlog with each probe key's
    fourth in its middle; the probe keys spread over the partitions."""

    def probe(i: int, value: bytes) -> dict[str, object]:
        return {"key": f"p{i}".encode(), "value": value, "partition": i % PARTITIONS}

    first = [
        probe(i, value)
        for i in range(PROBES)
        for value in (b"1-paid", b"2-shipped-fails-once", b"3-delivered")
    ]
    fourth = [probe(i, b"4-returned") for i in range(PROBES)]
    backlog = [
        {"key": b"backlog", "value": b"x", "partition": n % PARTITIONS} for n in range(BACKLOG)
    ]
    half = len(backlog) // 2
    return [*first, *backlog[:half], *fourth, *backlog[half:]]


def test_a_retry_on_a_per_group_topic_does_not_wait_behind_the_backlog_and_keeps_key_order(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("order-backlog", partitions=PARTITIONS)
    group = a_group()
    handled = Handled()
    # Produced before the App starts: the whole backlog is there when it begins.
    produce(bootstrap, topic, records())
    retries = per_group_retry_topic(group, topic)
    with retry_service(bootstrap, database_url, allowed_destinations=[retries]) as service:
        example = docs_app()
        app = App(
            bootstrap,
            group=group,
            requests_topic=service.settings.requests_topic,
            consumer_kafka=example.settings.consumer_kafka,
        )
        [route] = example.routes.values()
        assert route.strategy == Service(per_group_topic=True, ordering="key")
        app.add_handler(topic, handled.handle, strategy=route.strategy, policy=route.policy)
        with running_app(app):
            expected = [b"1-paid", b"2-shipped-fails-once", b"3-delivered", b"4-returned"]

            def done() -> bool:
                with handled.lock:
                    ordered = all(
                        len(handled.by_key.get(f"p{i}".encode(), [])) == 4 for i in range(PROBES)
                    )
                    return ordered and handled.backlog == BACKLOG

            assert wait_for(done, 180), (
                f"{handled.backlog} of {BACKLOG} backlog records handled; probes: {handled.by_key}"
            )
    # Key order held: each probe key's records in the order they were written, the
    # failed one retried once.
    assert handled.by_key == {f"p{i}".encode(): expected for i in range(PROBES)}
    # Every retry was handled while the backlog before its due time still drained:
    # not one waited behind it.
    assert len(handled.late_ms) == PROBES
    assert min(handled.backlog_left_at_retry) > 0, (handled.backlog_left_at_retry, handled.late_ms)
    late = sorted(handled.late_ms)
    print(
        f"{PROBES} retries due 1 s after their failure, behind a backlog of {BACKLOG} "
        f"records: handled {late[len(late) // 2]} ms after due (median), "
        f"{late[-1]} ms at most; backlog records left then: at least "
        f"{min(handled.backlog_left_at_retry)}"
    )
