"""The producers redrive makes place records by key with the partitioner chosen: the
Java producer's placement unless told otherwise. On the real broker and service.

Each check writes keys that the Java placement and librdkafka's default put on
different partitions, so a record lands where only one of the two would put it, and
compares with where librdkafka's own partitioner puts them (tests/integration/placement.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from redrive import App, FatalError, Message
from redrive.partitioners import DEFAULT_PARTITIONER, Partitioner
from tests.integration.consumer_harness import docs_example, running_app, running_example
from tests.integration.placement import KeysApart, keys_apart, landed
from tests.integration.service_harness import (
    Delivery,
    dead_letters,
    fresh_database,
    now_ms,
    produce,
    request_headers,
    running_service,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 6


def expected(apart: KeysApart, partitioner: Partitioner) -> dict[bytes, int]:
    if partitioner is Partitioner.MURMUR2_RANDOM:
        return apart.java
    assert partitioner is Partitioner.CONSISTENT_RANDOM
    return apart.librdkafka


def assert_placed(got: list[Delivery], apart: KeysApart, partitioner: Partitioner) -> None:
    where = {d.key: d.partition for d in got}
    assert where == expected(apart, partitioner), f"not placed by {partitioner.value}"


@pytest.mark.parametrize("partitioner", [None, Partitioner.CONSISTENT_RANDOM])
def test_the_services_producers_place_by_its_partitioner(
    partitioner: Partitioner | None,
    bootstrap: str,
    database_url: str,
    new_topic: Callable[..., str],
) -> None:
    """The scheduler's deliveries without a partition, the DLQ mirror and replays to
    another topic; without the setting, the Java placement."""
    chosen = partitioner or DEFAULT_PARTITIONER
    orders, mirror, other = (new_topic(n, partitions=PARTITIONS) for n in ("o", "m", "r"))
    overrides: dict[str, Any] = {} if partitioner is None else {"partitioner": partitioner}
    settings = settings_for(
        bootstrap,
        fresh_database(database_url),
        allowed_destinations=[orders, other],
        mirror_dead_letters=True,
        dlq_topic=mirror,
        **overrides,
    )
    apart = keys_apart(bootstrap, PARTITIONS, 12, "k")
    due = now_ms()
    with running_service(settings) as service:
        assert service.settings.partitioner is chosen
        # Retries that name no partition: the scheduler places them.
        produce(
            bootstrap,
            settings.requests_topic,
            [
                {"key": key, "value": b"retry", "headers": request_headers(orders, due)}
                for key in apart.keys
            ],
        )
        assert_placed(landed(bootstrap, orders, len(apart.keys)), apart, chosen)
        # Dead letters: intake mirrors each as it stores it.
        produce(
            bootstrap,
            settings.requests_topic,
            [
                {
                    "key": key,
                    "value": b"dead",
                    "headers": request_headers(
                        orders, due, send_to="dlq", original_topic=orders,
                        original_partition=0, original_offset=offset,
                    ),
                }
                for offset, key in enumerate(apart.keys)
            ],
        )  # fmt: skip
        assert_placed(landed(bootstrap, mirror, len(apart.keys)), apart, chosen)
        # Replayed to another topic, one alone and the rest by a job.
        db = service.database_url
        wait_until(lambda: len(dead_letters(db)) == len(apart.keys), 30, "the dead letters")
        ids = [int(row["id"]) for row in dead_letters(db)]
        operator = {"Authorization": f"Bearer {service.tokens.create('olivia', 'operator')}"}
        body = {"destination": other}
        with httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as api:
            one = api.post(f"/api/v1/dead-letters/{ids[0]}/replay", headers=operator, json=body)
            assert one.status_code == 200, one.text
            job = api.post(
                "/api/v1/dead-letters/replay", headers=operator, json={"ids": ids[1:], **body}
            )
            assert job.status_code == 202, job.text
            assert_placed(landed(bootstrap, other, len(apart.keys)), apart, chosen)


def dead_letters_of(bootstrap: str, topic: str, keys: list[bytes]) -> list[Delivery]:
    """Records of ``keys`` written to partition 0 of ``topic``, which a running App
    makes dead letters: the dead letters, as they arrive in ``<topic>.dlq``."""
    produce(bootstrap, topic, [{"key": k, "value": b"x", "partition": 0} for k in keys])
    return landed(bootstrap, f"{topic}.dlq", len(keys))


def test_the_apps_dead_letters_are_placed_by_key_the_java_way_by_default(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("payments", partitions=PARTITIONS)
    apart = keys_apart(bootstrap, PARTITIONS, 12, "p")

    def refuse(message: Message) -> None:
        raise FatalError("never")

    app = App(bootstrap, group=f"g-{uuid.uuid4().hex[:8]}")
    app.add_handler(topic, refuse, strategy="blocking")
    with running_app(app):
        got = dead_letters_of(bootstrap, topic, apart.keys)
    assert_placed(got, apart, Partitioner.MURMUR2_RANDOM)


def test_the_docs_example_places_dead_letters_as_librdkafka_does_by_default(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("payment-events", partitions=PARTITIONS)
    apart = keys_apart(bootstrap, PARTITIONS, 12, "e")
    source = docs_example(
        "## Where hand-offs land: the partitioner",
        {
            '"localhost:9092"': repr(bootstrap),
            'group="payments"': f"group={f'g-{uuid.uuid4().hex[:8]}'!r}",
            '"payment-events"': repr(topic),
        },
    )
    with running_example(source) as example:
        assert example["app"].settings.partitioner is Partitioner.CONSISTENT_RANDOM
        got = dead_letters_of(bootstrap, topic, apart.keys)
    assert_placed(got, apart, Partitioner.CONSISTENT_RANDOM)
