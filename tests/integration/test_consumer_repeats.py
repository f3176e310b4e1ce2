"""Repeat deliveries against the real broker and retry service: a redelivered record
the App handled already (the same ``redrive-id``: delivered twice, or handed off
twice) is skipped and counted, not handled again; with ``repeat_window=0`` it is
handled again, as at-least-once allows."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from redrive import App, Message, Service
from redrive.headers import decode
from tests.chaos.hand_offs import committed_hand_offs
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


def failing_once(calls: Calls) -> Callable[[Message], None]:
    """A handler noting each call that fails every record's first attempt."""

    def handler(message: Message) -> None:
        calls.add(message)
        if message.attempt == 1:
            raise Flaky("first attempt")

    return handler


@pytest.mark.parametrize("window", [100, 0])
def test_a_repeat_delivery_is_skipped_within_the_window(
    window: int, bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("repeats")
    calls = Calls()
    handler = failing_once(calls)

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


@pytest.mark.parametrize("transactional", [True, False])
def test_a_repeat_of_an_ordered_record_releases_its_key_again_only_without_transactions(
    transactional: bool, bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    """With ``ordering="key"`` a handled redelivery releases its key's queue. The
    retry service delivering it again (a crash between its delivery and its
    bookkeeping) is a repeat: without transactions it releases again (the first
    release may be lost); with them the first release was committed with the
    handling, and a second would be a second hand-off of the same request."""
    topic = new_topic("repeats-ordered")
    calls = Calls()
    handler = failing_once(calls)

    with retry_service(bootstrap, database_url, allowed_destinations=[topic]) as service:
        requests = service.settings.requests_topic
        app = App(
            bootstrap,
            group=f"g-repeats-ordered-{transactional}-{topic}",
            requests_topic=requests,
            transactional=transactional,
        )
        app.add_handler(topic, handler, strategy=Service(ordering="key"), policy="300ms x2")
        with running_app(app):
            produce(bootstrap, topic, [{"key": b"k", "value": b"x"}])
            assert calls.wait_for(lambda: len(calls.of(b"x")) == 2, 30)
            assert wait_for(lambda: releases(bootstrap, requests) == 1, 30)
            # Delivered to the group's own retry topic (key order's default), where the
            # repeat comes too.
            redelivery = app.routes[topic].redelivery_topic
            assert redelivery != topic
            collector = Collector(bootstrap, redelivery)
            [delivery] = [d for d in collector.poll_until(1, 20) if d.headers]
            collector.close()
            repeat = {"key": delivery.key, "value": delivery.value, "headers": delivery.headers}
            produce(bootstrap, redelivery, [{**repeat, "partition": delivery.partition}])
            assert wait_for(lambda: outcome_count(app, topic, "repeat_skipped") == 1, 20)
            expected = 1 if transactional else 2
            assert wait_for(lambda: releases(bootstrap, requests) == expected, 20)
            wait_for(lambda: releases(bootstrap, requests) > expected, 2.0)
            assert releases(bootstrap, requests) == expected
            assert [c.attempt for c in calls.of(b"x")] == [1, 2]


def releases(bootstrap: str, requests_topic: str) -> int:
    """The key-queue releases on the requests topic, as intake reads them."""
    found = committed_hand_offs(bootstrap, requests_topic)
    return sum(count for (kind, _), count in found.items() if kind == "release")
