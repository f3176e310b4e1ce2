"""Fault suite, the servers: the Kafka broker and PostgreSQL (this test's own) stopped
and restarted under a steady load of retries, nothing lost and every part healthy
again with no manual step (see tests/chaos/test_faults.py for what is counted)."""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from redrive.local.kafka import LocalKafka
from redrive.local.postgres import LocalPostgres
from redrive.ports import free_port
from tests.chaos.fault_checks import (
    APP_STRATEGIES,
    collect_all,
    create_topics,
    early_deliveries,
    fault_times,
    probe_app,
    probe_service,
    requests_to,
)
from tests.chaos.harness import (
    FAST_GROUP,
    MODE,
    AppProcess,
    Service,
    app_records,
    readyz,
    report,
    rng_for,
    sleep_until,
    tally,
    wait_for,
)
from tests.integration.service_harness import (
    Collector,
    Load,
    fresh_database,
    pending_count,
    settings_for,
)

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.integration,
    pytest.mark.timeout(MODE.test_timeout_s),
]


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
    lost = {s: r.lost for s, r in results.items()}
    assert lost == dict.fromkeys(APP_STRATEGIES, 0), (
        f"messages lost; what the service and the apps that lost some said:\n"
        f"{warnings_in(service.logs())}\n"
        + "\n".join(warnings_in(apps[s].log_tail(400)) for s, n in lost.items() if n)
    )
    assert early == dict.fromkeys(APP_STRATEGIES, 0), f"retries handled before due: {early}"
    assert all(alive.values()), f"an app died during the outage: {alive}"
    assert ready, "/readyz did not answer 200 after the broker came back"
    assert all(probed.values()), f"an app does not handle new messages: {probed}"
    assert codes == dict.fromkeys(APP_STRATEGIES, 0) and service_code == 0


WARNING_MARKS = (
    "[warning",
    "[error",
    "[critical",
    '"level": "warning"',
    '"level": "error"',
    "Error",
)
"""How a warning or an error line looks in the App's console logs and the service's JSON."""


def warnings_in(log: str, most: int = 40) -> str:
    """The last warning and error lines of a log: what a failed run shows of it."""
    lines = [line for line in log.splitlines() if any(level in line for level in WARNING_MARKS)]
    return "\n".join(lines[-most:]) or "(no warnings)"


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
