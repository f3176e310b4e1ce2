"""Repeat deliveries against the real broker and retry service: a redelivered record
the App handled already (the same ``redrive-id``: delivered twice, or handed off
twice) is skipped and counted, not handled again; with ``repeat_window=0`` it is
handled again, as at-least-once allows."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from redrive import App, Message
from redrive.headers import decode
from tests.integration.consumer_harness import (
    Calls,
    outcome_count,
    retry_service,
    running_app,
    wait_for,
)
from tests.integration.service_harness import Collector, produce

pytestmark = pytest.mark.integration


class Flaky(Exception):
    pass


@pytest.mark.parametrize("window", [100, 0])
def test_a_repeat_delivery_is_skipped_within_the_window(
    window: int, bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("repeats")
    calls = Calls()

    def handler(message: Message) -> None:
        calls.add(message)
        if message.attempt == 1:
            raise Flaky("first attempt")

    with retry_service(bootstrap, database_url, allowed_destinations=[topic]) as service:
        app = App(
            bootstrap,
            group=f"g-repeats-{window}-{topic}",
            requests_topic=service.settings.requests_topic,
            repeat_window=window,
        )
        app.add_handler(topic, handler, strategy="service", policy="300ms x2")
        with running_app(app):
            produce(bootstrap, topic, [{"key": b"k", "value": b"x"}])
            assert calls.wait_for(lambda: len(calls.of(b"x")) == 2, 30)
            # The service's delivery, as it sits in the topic: produce it once more.
            collector = Collector(bootstrap, topic)
            delivered = [d for d in collector.poll_until(2, 20) if d.headers]
            collector.close()
            [delivery] = delivered
            request, _ = decode(delivery.headers)
            assert request.id is not None
            produce(
                bootstrap,
                topic,
                [{"key": delivery.key, "value": delivery.value, "headers": delivery.headers}],
            )
            if window:
                assert wait_for(lambda: outcome_count(app, topic, "repeat_skipped") == 1, 20)
                wait_for(lambda: len(calls.of(b"x")) > 2, 1.0)
                assert [c.attempt for c in calls.of(b"x")] == [1, 2]
            else:
                assert calls.wait_for(lambda: len(calls.of(b"x")) == 3, 20)
                assert outcome_count(app, topic, "repeat_skipped") == 0
            # Counted at the end of the loop's turn, after the handler ran.
            wait_for(lambda: outcome_count(app, topic, "handled") == (1 if window else 2), 20)
            assert outcome_count(app, topic, "handled") == (1 if window else 2)
