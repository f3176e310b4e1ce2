"""Fault suite: under a steady load of retries, kill or stop each moving part and count.

Every case counts each message the broker acknowledged (sent) and each delivery or
successful handling (received); it ends with nothing lost (every sent message
received at least once), duplicates counted and printed (at-least-once allows them),
and the parts healthy again with no manual step: the service's /readyz answers 200
and a probe sent after the faults goes through it; the app handles new messages.

1. the retry service SIGKILLed at random moments, restarted each time;
2. the Kafka broker (this test's own) stopped and restarted, under a service and
   one app per strategy;
3. PostgreSQL (this test's own) stopped and restarted under `redrive serve`;
4. a consumer app SIGKILLed in the middle of `blocking`, `topics` and `service`
   retries, then restarted (tests/chaos/app_process.py).

`REDRIVE_CHAOS=long` runs the long mode (bigger load, more kills, longer outages);
`REDRIVE_CHAOS_SEED=N` repeats a run's randomness. Each test prints one line
`[chaos <case>] mode=... seed=...: sent S, received R, lost L, duplicates D; ...`.
"""

from __future__ import annotations

import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from redrive.local.kafka import LocalKafka
from redrive.local.postgres import LocalPostgres
from redrive.ports import free_port
from tests.chaos.harness import (
    FAST_GROUP,
    MODE,
    AppProcess,
    Service,
    app_records,
    now_ms,
    readyz,
    report,
    rng_for,
    sleep_until,
    tally,
    wait_for,
)
from tests.integration.consumer_harness import retry_service
from tests.integration.service_harness import (
    Collector,
    Load,
    Record,
    fresh_database,
    pending_count,
    produce,
    request_headers,
    settings_for,
)

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.integration,
    pytest.mark.timeout(MODE.test_timeout_s),
]

APP_STRATEGIES = ["blocking", "topics", "service"]
PROBES = 6


def fault_times(rng: random.Random, count: int, span_s: float, lo: float, hi: float) -> list[float]:
    """`count` moments in (0, span_s), one in each equal slice, at [lo, hi) of its slice."""
    width = span_s / count
    return [i * width + rng.uniform(lo, hi) * width for i in range(count)]


def requests_to(destination: str, rng: random.Random, prefix: str) -> Callable[[int], Record]:
    """Retry requests straight to the service, each due 0.2 to 3 s after it is made."""

    def make(i: int) -> Record:
        return {
            "key": f"k{i % 31}".encode(),
            "value": f"{prefix}-{i:06d}".encode(),
            "headers": request_headers(destination, now_ms() + rng.randrange(200, 3000)),
        }

    return make


def received_values(collector: Collector) -> Counter[bytes]:
    return Counter(d.value for d in collector.received if d.value is not None)


def collect_all(collector: Collector, sent: set[bytes], timeout_s: float) -> Counter[bytes]:
    """Collect until every sent value arrived (or the timeout), then until quiet."""
    deadline = time.monotonic() + timeout_s
    seen: set[bytes] = set()
    index = 0
    while time.monotonic() < deadline:
        seen.update(d.value for d in collector.received[index:] if d.value is not None)
        index = len(collector.received)
        if sent <= seen:
            break
        collector.poll_until(sys.maxsize, 0.5)
    collector.drain(quiet_s=2)
    return received_values(collector)


def early_deliveries(collector: Collector) -> int:
    """Deliveries that arrived before their retry-at (never allowed, even after a crash)."""
    early = 0
    for delivery in collector.received:
        due = delivery.header("redrive-retry-at")
        if due is not None and delivery.received_ms < int(due):
            early += 1
    return early


def probe_service(bootstrap: str, requests_topic: str, destination: str, c: Collector) -> bool:
    """Requests made after the faults go through the (restarted) service."""
    probes = {f"probe-{i}".encode() for i in range(PROBES)}
    produce(
        bootstrap,
        requests_topic,
        [
            {"key": p, "value": p, "headers": request_headers(destination, now_ms() + 300)}
            for p in sorted(probes)
        ],
    )
    return probes <= collect_all(c, probes, 60).keys()


def probe_app(bootstrap: str, app: AppProcess) -> bool:
    """New records, failing 0 to 2 times, are handled by the app's current process."""
    probes = [f"probe-{app.strategy}-{i}:f{i % 3}" for i in range(PROBES)]
    produce(bootstrap, app.topic, [{"key": p.encode(), "value": p.encode()} for p in probes])
    assert app.proc is not None
    pid = app.proc.pid

    def done() -> bool:
        handled = {e["value"] for e in app.events() if e["event"] == "ok" and e["pid"] == pid}
        return set(probes) <= handled

    return wait_for(done, 90, 0.5)


def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, num_partitions=partitions) for n in names])
    for future in futures.values():
        future.result(timeout=60)


# ---------------------------------------------------------------------- 1. service SIGKILL


def test_retry_service_sigkilled_at_random_moments_loses_nothing(
    bootstrap: str, database_url: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    case = "service SIGKILL"
    rng = rng_for(case)
    kills = fault_times(rng, MODE.service_kills, MODE.service_load_s, 0.15, 0.85)
    downtimes = [rng.uniform(0.0, 2.0) for _ in kills]
    destination = new_topic("chaos-kill", partitions=3)
    db = fresh_database(database_url)
    # A short lease: the restarted instance takes over the killed one's claimed rows soon.
    settings = settings_for(
        bootstrap, db, allowed_destinations=[destination], lease_seconds=2, kafka=FAST_GROUP
    )
    service = Service(settings, tmp_path)
    service.start()
    collector = Collector(bootstrap, destination)

    def pump() -> None:
        collector.poll_until(sys.maxsize, 0.2)

    load = Load(
        bootstrap,
        settings.requests_topic,
        MODE.service_rate,
        requests_to(destination, rng_for(case + "/load"), "req"),
    ).start()
    faults = []
    try:
        for at, down in zip(kills, downtimes, strict=True):
            sleep_until(load.started, at, pump)
            service.kill()
            faults.append(f"kill at {at:.1f}s after {load.made} made, down {down:.1f}s")
            sleep_until(time.monotonic(), down, pump)
            service.start()
        sleep_until(load.started, MODE.service_load_s, pump)
        sent = load.finish()
        received = collect_all(collector, sent, MODE.settle_s)
        ready = service.ready(60)
        probed = probe_service(bootstrap, settings.requests_topic, destination, collector)
    finally:
        load.stop()
        code = service.terminate()
        collector.close()
    result = tally(sent, received)
    report(case, result, "; ".join(faults), time.monotonic() - load.started)
    assert result.lost == 0, f"{result.lost} requests lost"
    assert early_deliveries(collector) == 0, "a retry arrived before it was due"
    assert ready, "/readyz did not answer 200 after the last restart"
    assert probed, "a request sent after the kills was not delivered"
    assert code == 0
    assert pending_count(db) == 0


# ---------------------------------------------------------------------- 2. Kafka restart


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[LocalKafka]:
    """A broker of this test's own, which it may stop without disturbing other tests."""
    port = free_port()
    controller = free_port()
    while controller == port:
        controller = free_port()
    broker = LocalKafka(tmp_path / "kafka", port, controller, heap="512m")
    broker.start(quiet=True)
    try:
        yield broker
    finally:
        broker.stop()


def test_kafka_broker_stopped_and_restarted_under_retries_loses_nothing(
    own_kafka: LocalKafka, database_url: str, tmp_path: Path
) -> None:
    case = "Kafka restart"
    rng = rng_for(case)
    outages = fault_times(rng, MODE.broker_outages, MODE.broker_load_s, 0.2, 0.5)
    kafka = own_kafka.bootstrap
    tag = uuid.uuid4().hex[:6]
    topics = {strategy: f"chaos-broker-{strategy}-{tag}" for strategy in APP_STRATEGIES}
    create_topics(kafka, list(topics.values()), partitions=6)
    settings = settings_for(
        kafka,
        fresh_database(database_url),
        allowed_destinations=[topics["service"]],
        kafka=FAST_GROUP,
    )
    service = Service(settings, tmp_path)
    service.start()
    apps = {
        strategy: AppProcess(
            kafka, topic, strategy, f"chaos-{strategy}-{tag}", settings.requests_topic, tmp_path
        )
        for strategy, topic in topics.items()
    }
    with ExitStack() as cleanup:
        cleanup.callback(service.terminate)
        for app in apps.values():
            app.start()
            cleanup.callback(app.terminate)
        # blocking retries in place: a failing record holds its partition, so less load.
        loads = {
            strategy: Load(
                kafka,
                topics[strategy],
                MODE.app_rate // 2 if strategy == "blocking" else MODE.app_rate,
                app_records(strategy, rng_for(f"{case}/{strategy}")),
                name=strategy,
            ).start()
            for strategy in APP_STRATEGIES
        }
        for load in loads.values():
            cleanup.callback(load.stop)
        started = min(load.started for load in loads.values())
        faults = []
        for at in outages:
            sleep_until(started, at)
            in_retry = {s: len(app.in_retry()) for s, app in apps.items()}
            own_kafka.stop()
            stopped = time.monotonic()
            sleep_until(stopped, MODE.broker_outage_s)
            own_kafka.start(quiet=True)
            faults.append(
                f"broker down at {at:.1f}s for {time.monotonic() - stopped:.1f}s "
                f"(retries in flight {in_retry})"
            )
        sleep_until(started, MODE.broker_load_s)
        sent = {strategy: load.finish() for strategy, load in loads.items()}
        wait_for(
            lambda: all(sent[s] <= apps[s].handled().keys() for s in APP_STRATEGIES),
            MODE.settle_s,
            1.0,
        )
        alive = {s: app.alive() for s, app in apps.items()}
        early = {s: app.early() for s, app in apps.items()}
        ready = service.ready(60)
        probed = {s: probe_app(kafka, app) for s, app in apps.items()}
        elapsed = time.monotonic() - started
        results = {s: tally(sent[s], apps[s].handled()) for s in APP_STRATEGIES}
        for strategy, result in results.items():
            report(f"{case} / {strategy}", result, "; ".join(faults), elapsed)
        cleanup.pop_all()
        codes = {s: app.terminate() for s, app in apps.items()}
        service_code = service.terminate()
    assert {s: r.lost for s, r in results.items()} == dict.fromkeys(APP_STRATEGIES, 0), (
        "messages lost"
    )
    assert early == dict.fromkeys(APP_STRATEGIES, 0), f"retries handled before due: {early}"
    assert all(alive.values()), f"an app died during the outage: {alive}"
    assert ready, "/readyz did not answer 200 after the broker came back"
    assert all(probed.values()), f"an app does not handle new messages: {probed}"
    assert codes == dict.fromkeys(APP_STRATEGIES, 0) and service_code == 0


# ---------------------------------------------------------------------- 3. PostgreSQL restart


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[LocalPostgres]:
    """A PostgreSQL of this test's own, which it may stop without disturbing others."""
    server = LocalPostgres(tmp_path / "pg", free_port())
    server.start(quiet=True)
    try:
        yield server
    finally:
        server.stop()


def test_postgres_stopped_and_restarted_under_serve_loses_nothing(
    bootstrap: str, own_postgres: LocalPostgres, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    case = "PostgreSQL restart"
    rng = rng_for(case)
    outages = fault_times(rng, MODE.pg_outages, MODE.pg_load_s, 0.15, 0.35)
    destination = new_topic("chaos-pg", partitions=3)
    settings = settings_for(
        bootstrap,
        own_postgres.url(),
        allowed_destinations=[destination],
        store_retry_max_seconds=1.0,
        kafka=FAST_GROUP,
    )
    service = Service(settings, tmp_path)
    service.start()
    collector = Collector(bootstrap, destination)
    seen_codes: Counter[int | None] = Counter()

    def pump() -> None:
        collector.poll_until(sys.maxsize, 0.3)

    def pump_and_probe_readiness() -> None:
        pump()
        seen_codes[readyz(service.port)] += 1

    load = Load(
        bootstrap,
        settings.requests_topic,
        MODE.service_rate,
        requests_to(destination, rng_for(case + "/load"), "req"),
    ).start()
    faults = []
    try:
        for at in outages:
            sleep_until(load.started, at, pump)
            own_postgres.stop()
            stopped = time.monotonic()
            sleep_until(stopped, MODE.pg_outage_s, pump_and_probe_readiness)
            own_postgres.start(quiet=True)
            faults.append(f"PostgreSQL down at {at:.1f}s for {time.monotonic() - stopped:.1f}s")
        sleep_until(load.started, MODE.pg_load_s, pump)
        sent = load.finish()
        received = collect_all(collector, sent, MODE.settle_s)
        ready = service.ready(60)
        probed = probe_service(bootstrap, settings.requests_topic, destination, collector)
        alive = service.alive()
    finally:
        load.stop()
        code = service.terminate()
        collector.close()
    result = tally(sent, received)
    faults.append(f"/readyz during outages {dict(seen_codes)}")
    report(case, result, "; ".join(faults), time.monotonic() - load.started)
    assert seen_codes[503] > 0, "/readyz never said 503: the outage was not noticed"
    assert result.lost == 0, f"{result.lost} requests lost"
    assert early_deliveries(collector) == 0, "a retry arrived before it was due"
    assert alive, "the service process exited during the outage"
    assert ready, "/readyz did not answer 200 after PostgreSQL came back"
    assert probed, "a request sent after the outage was not delivered"
    assert code == 0
    assert pending_count(own_postgres.url()) == 0


# ---------------------------------------------------------------------- 4. app SIGKILL


@pytest.mark.parametrize("strategy", APP_STRATEGIES)
def test_app_sigkilled_in_the_middle_of_retries_loses_nothing(
    strategy: str,
    bootstrap: str,
    database_url: str,
    new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    case = f"app SIGKILL / {strategy}"
    rng = rng_for(case)
    kills = fault_times(rng, MODE.app_kills, MODE.app_load_s, 0.3, 0.8)
    downtimes = [rng.uniform(0.5, 3.0) for _ in kills]
    topic = new_topic(f"chaos-app-{strategy}", partitions=6)
    with ExitStack() as stack:
        requests_topic = "redrive.requests"
        if strategy == "service":
            service = stack.enter_context(
                retry_service(bootstrap, database_url, allowed_destinations=[topic])
            )
            requests_topic = service.settings.requests_topic
        app = AppProcess(
            bootstrap, topic, strategy, f"chaos-{uuid.uuid4().hex[:8]}", requests_topic, tmp_path
        )
        app.start()
        load: Load | None = None
        try:
            rate = MODE.app_rate // 2 if strategy == "blocking" else MODE.app_rate
            load = Load(bootstrap, topic, rate, app_records("m", rng_for(case + "/load"))).start()
            faults = []
            for at, down in zip(kills, downtimes, strict=True):
                sleep_until(load.started, at)
                # In the middle of retries: a record failed and has not succeeded yet.
                assert wait_for(lambda: bool(app.in_retry()), 30, 0.1), app.log_tail()
                in_retry = len(app.in_retry())
                app.kill()
                faults.append(
                    f"kill at {at:.1f}s with {in_retry} retries in flight, down {down:.1f}s"
                )
                time.sleep(down)
                app.start()
            sleep_until(load.started, MODE.app_load_s)
            sent = load.finish()
            wait_for(lambda: sent <= app.handled().keys(), MODE.settle_s, 0.5)
            handled = app.handled()
            alive = app.alive()
            probed = probe_app(bootstrap, app)
            elapsed = time.monotonic() - load.started
        finally:
            if load is not None:
                load.stop()
            code = app.terminate()
    result = tally(sent, handled)
    report(case, result, "; ".join(faults), elapsed)
    assert result.lost == 0, f"{result.lost} messages never handled\n{app.log_tail()}"
    assert app.early() == 0, "a retry was handled before it was due"
    assert alive, f"the restarted app died\n{app.log_tail()}"
    assert probed, f"the restarted app does not handle new messages\n{app.log_tail()}"
    assert code == 0
