"""Where a replayed dead letter lands, on the real service, broker and database.

Replayed to the topic it was read from, a letter goes back to the partition it was
read from, byte for byte; if that topic no longer has that partition, or the letter
goes to another topic, it is placed by its key the Java way. Single replays and
replay jobs alike. The keys are chosen so that the Java placement, librdkafka's
default placement and the letter's own partition all differ: a letter can only land
where the rule under test puts it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from redrive.deadlines import Deadline
from redrive.headers import Header
from redrive.service.service import RetryService
from tests.integration.placement import KeysApart, keys_apart, landed
from tests.integration.service_harness import (
    Delivery,
    dead_letters,
    fresh_database,
    now_ms,
    produce,
    replay_split,
    request_headers,
    running_service,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 6  # of the letters' own topic
OTHER_PARTITIONS = 4  # of the topic some are replayed to instead
USER_HEADERS: list[Header] = [("trace-id", b"t\x00\xff"), ("empty", None), ("trace-id", b"2nd")]


@dataclass
class Env:
    service: RetryService
    api: httpx.Client
    operator: dict[str, str]
    bootstrap: str
    orders: str
    other: str


@pytest.fixture
def env(bootstrap: str, database_url: str, new_topic: Callable[..., str]) -> Iterator[Env]:
    orders = new_topic("orders", partitions=PARTITIONS)
    other = new_topic("orders-again", partitions=OTHER_PARTITIONS)
    settings = settings_for(
        bootstrap,
        fresh_database(database_url),
        allowed_destinations=[orders, other],
        replay_rate_per_second=2000,
    )
    with running_service(settings) as service:
        operator = {"Authorization": f"Bearer {service.tokens.create('olivia', 'operator')}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as api:
            yield Env(service, api, operator, bootstrap, orders, other)


@dataclass(frozen=True)
class Letter:
    key: bytes | None
    value: bytes
    partition: int  # where it was read


def make_letters(env: Env, letters: list[Letter]) -> list[int]:
    """Dead letters of records read from ``env.orders`` at each letter's partition, as
    a consumer that gave up sends them; their ids, in the order given."""
    produce(
        env.bootstrap,
        env.service.settings.requests_topic,
        [
            {
                "key": letter.key,
                "value": letter.value,
                "headers": request_headers(
                    env.orders,
                    now_ms(),
                    user_headers=USER_HEADERS,
                    send_to="dlq",
                    attempt=3,
                    group="billing",
                    error_type="billing.Timeout",
                    error_message="gateway timed out",
                    original_topic=env.orders,
                    original_partition=letter.partition,
                    original_offset=offset,
                    reason="attempts exhausted (3 of 3)",
                ),
            }
            for offset, letter in enumerate(letters)
        ],
    )
    db = env.service.database_url
    wait_until(lambda: len(dead_letters(db)) == len(letters), 30, "the dead letters")
    ids = {bytes(row["msg_value"]): int(row["id"]) for row in dead_letters(db)}
    return [ids[letter.value] for letter in letters]


def replay(env: Env, ids: list[int], destination: str | None = None) -> None:
    """The first letter replayed alone, the others by a replay job; returns once the
    job is done."""
    body: dict[str, Any] = {} if destination is None else {"destination": destination}
    one = env.api.post(f"/api/v1/dead-letters/{ids[0]}/replay", headers=env.operator, json=body)
    assert one.status_code == 200, one.text
    started = env.api.post(
        "/api/v1/dead-letters/replay", headers=env.operator, json={"ids": ids[1:], **body}
    )
    assert started.status_code == 202, started.text
    job_id = started.json()["job"]["id"]
    deadline = Deadline(30)
    while (job := env.api.get(f"/api/v1/jobs/{job_id}").json())["state"] == "running":
        assert not deadline.passed(), f"replay job {job_id} did not end: {job}"
        time.sleep(0.1)
    assert (job["state"], job["sent"]) == ("done", len(ids) - 1), job


def arrivals(bootstrap: str, topic: str, count: int) -> dict[bytes, Delivery]:
    """The ``count`` records replayed to ``topic``, by value."""
    return {d.value: d for d in landed(bootstrap, topic, count) if d.value is not None}


def test_a_letter_replayed_to_its_topic_goes_back_to_its_partition_byte_for_byte(
    env: Env,
) -> None:
    apart = keys_apart(env.bootstrap, PARTITIONS, 8, "back")
    letters = [
        Letter(key, f"v{i}-\x00\xff".encode(), apart.elsewhere(key, i, PARTITIONS))
        for i, key in enumerate(apart.keys)
    ]
    letters.append(Letter(None, b"no key", 4))  # no key to place it by: its partition
    ids = make_letters(env, letters)
    page = env.api.get(f"/dead-letters/{ids[0]}")  # the UI says where a replay lands
    assert page.status_code == 200, page.text
    assert f"it goes back to partition {letters[0].partition}, where" in page.text
    replay(env, ids)
    got = arrivals(env.bootstrap, env.orders, len(letters))
    for letter in letters:
        arrived = got[letter.value]
        assert arrived.partition == letter.partition, (letter, arrived.partition)
        assert arrived.key == letter.key
        # The user's headers, in order, and no redrive header but the replay's round.
        users, replay_headers = replay_split(arrived.headers)
        assert users == USER_HEADERS
        assert replay_headers["redrive-replays"] == b"1"
    assert dead_letters(env.service.database_url) == []


def test_a_letter_whose_partition_is_gone_or_sent_elsewhere_is_placed_by_key_the_java_way(
    env: Env,
) -> None:
    # Read when the topic had more partitions (it was made again with fewer since).
    gone = keys_apart(env.bootstrap, PARTITIONS, 6, "gone")
    letters = [
        Letter(key, f"gone-{i}".encode(), PARTITIONS + i % 3) for i, key in enumerate(gone.keys)
    ]
    replay(env, make_letters(env, letters))
    got = arrivals(env.bootstrap, env.orders, len(letters))
    assert_placed(got, letters, gone)

    # Replayed to another topic: its partitions have nothing to do with the letter's.
    elsewhere = keys_apart(env.bootstrap, OTHER_PARTITIONS, 6, "elsewhere")
    moved = [
        Letter(key, f"moved-{i}".encode(), elsewhere.elsewhere(key, i, OTHER_PARTITIONS))
        for i, key in enumerate(elsewhere.keys)
    ]
    replay(env, make_letters(env, moved), destination=env.other)
    got = arrivals(env.bootstrap, env.other, len(moved))
    assert_placed(got, moved, elsewhere)


def assert_placed(got: dict[bytes, Delivery], letters: list[Letter], apart: KeysApart) -> None:
    for letter in letters:
        assert letter.key is not None
        arrived = got[letter.value]
        assert arrived.partition == apart.java[letter.key], (letter, arrived.partition)
        assert arrived.partition != apart.librdkafka[letter.key]
        assert (arrived.key, replay_split(arrived.headers)[0]) == (letter.key, USER_HEADERS)
