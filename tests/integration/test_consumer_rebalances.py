"""The consumer library at least once through rebalances: two instances sharing a
group through two rebalances handle every record, and a partition waiting for a
retry still gets it when a rebalance gives the partition back.

Everything runs against the real broker (and PostgreSQL for `service`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import pytest

from redrive import App, Message
from tests.integration.consumer_harness import (
    Calls,
    Flaky,
    Rebalances,
    a_group,
    requests_topic_for,
    running_app,
    waiting_partitions,
)
from tests.integration.service_harness import now_ms, produce

pytestmark = pytest.mark.integration


# ------------------------------------------------------------------ 4. two instances, rebalances


@pytest.mark.parametrize(
    "strategy",
    [
        "service",
        "topics",
    ],
)
def test_two_instances_through_two_rebalances_handle_every_record_at_least_once(
    strategy: str, bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(f"pair-{strategy}", partitions=4)
    group = a_group()
    values = [f"m{i:03d}".encode() for i in range(200)]
    flaky = set(values[::5])  # 20% fail twice, then succeed
    calls = {"A": Calls(), "B": Calls()}

    def handler_of(name: str) -> Callable[[Message], None]:
        def handler(message: Message) -> None:
            calls[name].add(message)
            if message.raw_value in flaky and message.attempt < 3:
                raise Flaky(f"attempt {message.attempt}")

        return handler

    def successes() -> dict[bytes | None, int]:
        counts: dict[bytes | None, int] = {}
        for log in calls.values():
            with log.lock:
                for c in log.items:
                    if c.value not in flaky or c.attempt >= 3:
                        counts[c.value] = counts.get(c.value, 0) + 1
        return counts

    def first_failures(among: list[bytes]) -> int:
        wanted = set(among) & flaky
        return sum(
            1
            for log in calls.values()
            for c in list(log.items)
            if c.value in wanted and c.attempt == 1
        )

    def records(chunk: list[bytes]) -> list[dict[str, Any]]:
        return [{"key": b"k%d" % (int(v[1:]) % 13), "value": v} for v in chunk]

    waves = values[:80], values[80:140], values[140:]
    with requests_topic_for(strategy, bootstrap, database_url, topic) as (requests, _):
        apps = {}
        for name in ("A", "B"):
            apps[name] = App(bootstrap, group=group, requests_topic=requests)
            apps[name].add_handler(
                topic,
                handler_of(name),
                policy="3s x3",
                strategy=strategy,  # type: ignore[arg-type]
            )
        a, b = apps["A"], apps["B"]
        a_owns, b_owns = Rebalances(a), Rebalances(b)
        with ExitStack() as a_running:
            a_running.enter_context(running_app(a))
            produce(bootstrap, topic, records(waves[0]))
            assert calls["A"].wait_for(lambda: first_failures(waves[0]) >= 10, 20)
            with running_app(b):  # first rebalance, with retries in flight
                assert calls["B"].wait_for(
                    lambda: (
                        len(a_owns.partitions_of(topic)) == len(b_owns.partitions_of(topic)) == 2
                    ),
                    30,
                ), f"A: {a_owns.seen()}, B: {b_owns.seen()}"
                produce(bootstrap, topic, records(waves[1]))
                assert calls["B"].wait_for(lambda: len(calls["B"].items) > 0, 20)
                produce(bootstrap, topic, records(waves[2]))
                assert calls["A"].wait_for(lambda: first_failures(waves[2]) >= 1, 20)
                if strategy == "topics":  # B too has retries waiting in its tier partitions
                    assert calls["B"].wait_for(lambda: waiting_partitions(b) >= 1, 20)
                a_running.close()  # second rebalance: A leaves, retries in flight
                assert not a.running.is_set()
                assert calls["B"].wait_for(lambda: len(b_owns.partitions_of(topic)) == 4, 30)
                assert calls["B"].wait_for(lambda: len(successes()) >= len(values), 30), (
                    f"never handled: {sorted(set(values) - set(successes()))}"
                )
                time.sleep(2.0)  # let late duplicates arrive before counting them

    counts = successes()
    assert set(counts) == set(values)
    duplicates = {v: n for v, n in counts.items() if n > 1}
    handled_by = {name: len(log.items) for name, log in calls.items()}
    extra = sum(duplicates.values()) - len(duplicates)
    print(
        f"{strategy}: {len(values)} records, handler calls {handled_by}, "
        f"{len(duplicates)} handled successfully more than once ({extra} extra): "
        f"{sorted(v or b'' for v in duplicates)[:20]}; "
        f"rebalances seen by A: {a_owns.seen()}, by B: {b_owns.seen()}"
    )
    assert handled_by["A"] > 0 and handled_by["B"] > 0


# ------------------------------------------------------------ 4b. a waiting partition given back


@pytest.mark.parametrize("strategy", ["blocking", "topics"])
def test_a_partition_waiting_for_a_retry_still_gets_it_after_a_rebalance_gives_it_back(
    strategy: str, bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """Both partitions wait for a retry on instance A when B joins: the rebalance gives
    one partition to B and the other back to A. Both retries must come when due."""
    delay_s = 10
    topic = new_topic(f"back-{strategy}", partitions=2)
    group = a_group()
    waiting_values = [b"wait-0", b"wait-1"]
    seen: set[bytes | None] = set()
    seen_lock = threading.Lock()
    calls = {"A": Calls(), "B": Calls()}

    def handler_of(name: str) -> Callable[[Message], None]:
        def handler(message: Message) -> None:
            calls[name].add(message)
            with seen_lock:  # the first handling of each record fails, on either instance
                first = message.raw_value not in seen
                seen.add(message.raw_value)
            if first:
                raise Flaky("first handling fails")

        return handler

    apps = {}
    for name in ("A", "B"):
        apps[name] = App(bootstrap, group=group)
        apps[name].add_handler(
            topic,
            handler_of(name),
            policy=f"{delay_s}s",
            strategy=strategy,  # type: ignore[arg-type]
        )
    a, b = apps["A"], apps["B"]
    a_owns = Rebalances(a)

    def handled_after_failing(value: bytes) -> bool:
        return sum(len(log.of(value)) for log in calls.values()) >= 2

    with running_app(a):
        produce(
            bootstrap,
            topic,
            [{"key": v, "value": v, "partition": i} for i, v in enumerate(waiting_values)],
        )
        assert calls["A"].wait_for(lambda: all(calls["A"].of(v) for v in waiting_values), 20)
        failed_at = max(calls["A"].of(v)[0].at_ms for v in waiting_values)
        if not calls["A"].wait_for(lambda: waiting_partitions(a) == 2, 10):
            pytest.fail("precondition: A does not hold both partitions waiting")
        with running_app(b):
            if not calls["A"].wait_for(lambda: len(a_owns.seen()) >= 3, 10):
                pytest.fail(f"precondition: no rebalance on A: {a_owns.seen()}")
            if now_ms() >= failed_at + delay_s * 1000 - 1000:
                pytest.fail("precondition: the rebalance came after the retries were due")
            assert calls["A"].wait_for(
                lambda: all(handled_after_failing(v) for v in waiting_values), delay_s + 8
            ), (
                f"a retry never came; A's rebalances: {a_owns.seen()}; "
                f"A handled {[(c.value, c.partition) for c in calls['A'].items]}, "
                f"B handled {[(c.value, c.partition) for c in calls['B'].items]}"
            )
