"""Fault suite: under a steady load of retries, kill or stop each moving part and count.

Every case counts each message the broker acknowledged (sent) and each delivery or
successful handling (received); it ends with nothing lost (every sent message
received at least once), duplicates counted and printed (at-least-once allows them),
and the parts healthy again with no manual step: the service's /readyz answers 200
and a probe sent after the faults goes through it; the app handles new messages.

1. the retry service SIGKILLed at random moments, restarted each time: under
   requests made straight to it, and under an App (strategy `service`,
   `transactional=True`) whose retries it delivers;
2. the Kafka broker (this test's own) stopped and restarted, under a service and
   one app per strategy;
3. PostgreSQL (this test's own) stopped and restarted under `redrive serve`;
4. a consumer app SIGKILLed in the middle of `blocking`, `topics` and `service`
   retries, then restarted (tests/chaos/app_process.py); `topics` and `service` also
   with `transactional=True`.

What "duplicate" means, each counted apart:

- duplicate requests: records of the hand-off topics (the service's requests topic,
  the `topics` strategy's tiers), read committed, with a `redrive-id` found before,
  i.e. the same (group, original topic, partition, offset, attempt) handed off
  again. With transactions an App SIGKILLed hands none off twice (asserted);
- duplicate deliveries: the service's deliveries of one `redrive-id` more than once
  (a service killed between a delivery and its bookkeeping: at least once);
- duplicates (the `received` tally of an app case): records handled successfully
  more than once; repeated handler calls: calls of a record at an attempt it was
  called at before; repeat_skipped: repeat deliveries the App skipped by their
  `redrive-id` (its log's "repeat delivery skipped").

`REDRIVE_CHAOS=long` runs the long mode (bigger load, more kills, longer outages);
`REDRIVE_CHAOS_SEED=N` repeats a run's randomness. Each test prints one line
`[chaos <case>] mode=... seed=...: sent S, received R, lost L, duplicates D; ...`,
the app cases with the counts above after D.
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

from redrive.deadlines import Deadline
from redrive.local.kafka import LocalKafka
from redrive.local.postgres import LocalPostgres
from redrive.ports import free_port
from tests.chaos.harness import (
    FAST_GROUP,
    LONG,
    MODE,
    AppProcess,
    Request,
    Service,
    app_records,
    committed_requests,
    duplicates_of,
    extra,
    now_ms,
    readyz,
    report,
    rng_for,
    sleep_until,
    tally,
    tier_topics,
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
    deadline = Deadline(timeout_s)
    seen: set[bytes] = set()
    index = 0
    while not deadline.passed():
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


def kill_service(
    service: Service,
    kills: list[float],
    downtimes: list[float],
    t0: float,
    made: Callable[[], int],
    pump: Callable[[], None] | None = None,
    moment: Callable[[], bool] | None = None,
) -> list[str]:
    """SIGKILL the service `kills` seconds after `t0`, restart it after each downtime;
    what happened, for the report (`made`: how many records the load made so far).
    `moment`: from then on, kill as soon as it says so (within a second)."""
    faults = []
    for at, down in zip(kills, downtimes, strict=True):
        sleep_until(t0, at, pump)
        waited = time.monotonic()
        timely = moment is not None and wait_for(moment, 1.0, 0)
        service.kill()
        how = f" ({time.monotonic() - waited:.2f}s later, delivering)" if timely else ""
        faults.append(f"kill at {at:.1f}s{how} after {made()} made, down {down:.1f}s")
        sleep_until(time.monotonic(), down, pump)
        service.start()
    return faults


def repeats_explained(requests: list[Request], deliveries: list[Request]) -> tuple[int, int]:
    """Duplicate requests (extra copies of one redrive-id) in all, and those not
    explained by a repeat delivery: a request for attempt N+1 made twice is explained
    when the delivery of attempt N of the same failure reached the App twice (each
    copy failed again and handed the next attempt off: what the App's repeat window
    prevents, as it remembers deliveries handed off as well as handled)."""
    delivered = Counter((d.group, d.origin, d.attempt) for d in deliveries)
    first = {r.id: r for r in requests}
    repeated = duplicates_of(requests)
    unexplained = {
        i: n
        for i, n in repeated.items()
        if (r := first[i]).attempt is None or delivered[(r.group, r.origin, r.attempt - 1)] < n
    }
    return extra(repeated), extra(Counter(unexplained))


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
    try:
        faults = kill_service(service, kills, downtimes, load.started, lambda: load.made, pump)
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


@pytest.mark.parametrize(
    "transactional",
    [
        # The App is not killed here: without transactions it hands off as with them
        # (the kills are the service's), so the baseline runs in the long mode only.
        pytest.param(
            False,
            id="at-least-once",
            marks=pytest.mark.skipif(MODE is not LONG, reason="long mode only (make chaos)"),
        ),
        pytest.param(True, id="transactional"),
    ],
)
def test_retry_service_sigkilled_under_an_app_hands_each_retry_off_once(
    transactional: bool,
    bootstrap: str,
    database_url: str,
    new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    """The service SIGKILLed while an App (strategy service) hands it its retries.

    A service killed between a delivery and its bookkeeping delivers the retry again
    once restarted: a duplicate *delivery*, with the same redrive-id (not a duplicate
    request); the kills wait for a delivery to make that likely. The App skips the
    repeat of a delivery it dealt with: no record is handled successfully twice, and
    the repeat of a delivery that failed does not fail again to hand the next attempt
    off twice (the App is not killed, so its window of ids is intact): 0 duplicate
    requests, asserted, transactions or not."""
    case = "service SIGKILL / app" + (" / transactional" if transactional else "")
    rng = rng_for("service SIGKILL / app")  # the same kills and records in both variants
    kills = fault_times(rng, MODE.service_kills, MODE.service_load_s, 0.15, 0.85)
    downtimes = [rng.uniform(0.0, 2.0) for _ in kills]
    topic = new_topic("chaos-kill-app", partitions=3)
    group = f"chaos-{uuid.uuid4().hex[:8]}"
    db = fresh_database(database_url)
    settings = settings_for(
        bootstrap,
        db,
        allowed_destinations=[topic],
        lease_seconds=2,
        kafka=FAST_GROUP,
    )
    service = Service(settings, tmp_path)
    service.start()
    app = AppProcess(
        bootstrap,
        topic,
        "service",
        group,
        settings.requests_topic,
        tmp_path,
        # Static, as docs/consumer.md advises with transactions (not killed here anyway).
        instance_id="kill-0" if transactional else None,
        transactional=transactional,
    )
    with ExitStack() as cleanup:
        cleanup.callback(service.terminate)
        app.start()
        cleanup.callback(app.terminate)
        load = Load(
            bootstrap,
            topic,
            MODE.service_rate,
            app_records("s", rng_for("service SIGKILL / app/load")),
        ).start()
        cleanup.callback(load.stop)
        # The kills are timed from the App's first record (retries flowing through),
        # each at the next delivery seen (the service is then between a delivery and
        # its bookkeeping more often than at a random instant).
        assert wait_for(lambda: bool(app.events()), 60, 0.1), app.log_tail()
        t0 = time.monotonic()
        watch = Collector(bootstrap, topic)
        cleanup.callback(watch.close)

        def delivering() -> bool:
            before = len(watch.received)
            watch.poll_until(before + 1, 0.05)
            return any(d.header("redrive-id") for d in watch.received[before:])

        def pump() -> None:
            watch.poll_until(sys.maxsize, 0.2)

        faults = kill_service(service, kills, downtimes, t0, lambda: load.made, pump, delivering)
        sleep_until(t0, MODE.service_load_s)
        sent = load.finish()
        wait_for(lambda: sent <= app.handled().keys(), MODE.settle_s, 0.5)
        handled = app.handled()
        alive = app.alive()
        ready = service.ready(60)
        probed = probe_app(bootstrap, app)
        elapsed = time.monotonic() - load.started
        cleanup.pop_all()
        watch.close()
        app_code = app.terminate()
        service_code = service.terminate()
    # Counted once nothing writes any more, committed records only.
    requests = committed_requests(bootstrap, [settings.requests_topic])
    deliveries = committed_requests(bootstrap, [topic])
    duplicate_requests, unexplained = repeats_explained(requests, deliveries)
    result = tally(sent, handled)
    skipped = app.logged("repeat delivery skipped")
    counts = (
        f"retry requests {len(requests)}, duplicate requests {duplicate_requests} "
        f"({unexplained} not after a repeat delivery), deliveries {len(deliveries)}, "
        f"duplicate deliveries {extra(duplicates_of(deliveries))}, "
        f"repeat_skipped {skipped}, repeated handler calls {app.repeated_calls(sent)}"
    )
    report(case, result, "; ".join(faults), elapsed, counts)
    assert result.lost == 0, f"{result.lost} messages never handled\n{app.log_tail()}"
    assert result.duplicates == 0, "a repeat delivery reached the handler again and succeeded"
    # The App is never killed here: its repeat window knows every delivery it dealt
    # with, so a repeat delivery is skipped instead of failing again.
    assert duplicate_requests == 0, f"{unexplained} of the duplicate requests unexplained"
    assert requests, "no retry went through the service"
    assert app.early() == 0, "a retry was handled before it was due"
    assert alive, f"the app died\n{app.log_tail()}"
    assert ready, "/readyz did not answer 200 after the last restart"
    assert probed, f"the app does not handle new messages\n{app.log_tail()}"
    assert app_code == 0 and service_code == 0
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


# The at-least-once baseline for each strategy, and the exactly-once hand-off
# (App(transactional=True), static membership as docs/consumer.md advises) for the
# strategies that hand retries off (blocking retries in place: nothing to hand off).
APP_KILL_CASES = [
    *(pytest.param(strategy, False, id=strategy) for strategy in APP_STRATEGIES),
    pytest.param("topics", True, id="topics-transactional"),
    pytest.param("service", True, id="service-transactional"),
]


@pytest.mark.parametrize(("strategy", "transactional"), APP_KILL_CASES)
def test_app_sigkilled_in_the_middle_of_retries_loses_nothing(
    strategy: str,
    transactional: bool,
    bootstrap: str,
    database_url: str,
    new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    """Without transactions a failure handed off and not yet committed past is handed
    off again by the restarted App (a duplicate retry request, same redrive-id): only
    counted. With them, none: asserted. The handler runs at least once either way
    (the records since the last commit are handled again), so its repeats are counted."""
    case = f"app SIGKILL / {strategy}"
    rng = rng_for(case)  # the same kills and records with and without transactions
    if transactional:
        case += " / transactional"
    kills = fault_times(rng, MODE.app_kills, MODE.app_load_s, 0.3, 0.8)
    downtimes = [rng.uniform(0.5, 3.0) for _ in kills]
    topic = new_topic(f"chaos-app-{strategy}", partitions=6)
    group = f"chaos-{uuid.uuid4().hex[:8]}"
    with ExitStack() as stack:
        requests_topic = "redrive.requests"
        if strategy == "service":
            service = stack.enter_context(
                retry_service(bootstrap, database_url, allowed_destinations=[topic])
            )
            requests_topic = service.settings.requests_topic
        app = AppProcess(
            bootstrap,
            topic,
            strategy,
            group,
            requests_topic,
            tmp_path,
            instance_id=f"{strategy}-0" if transactional else None,
            transactional=transactional,
        )
        app.start()
        load: Load | None = None
        try:
            rate = MODE.app_rate // 2 if strategy == "blocking" else MODE.app_rate
            load = Load(
                bootstrap, topic, rate, app_records("m", rng_for(f"app SIGKILL / {strategy}/load"))
            ).start()
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
    # Counted once the App stopped (no transaction open), committed records only: the
    # retry requests in the service's requests topic, the records of the tiers.
    where = {
        "service": [requests_topic],
        "topics": tier_topics(bootstrap, group, topic),
        "blocking": [],
    }[strategy]
    requests = [r for r in committed_requests(bootstrap, where) if r.group == group]
    duplicate_requests = extra(duplicates_of(requests))
    result = tally(sent, handled)
    handoffs = (
        f"retry requests {len(requests)}, duplicate requests {duplicate_requests}"
        if where
        else "retry requests none (in place)"
    )
    if strategy == "service":  # the service's deliveries back to the topic (not killed)
        deliveries = committed_requests(bootstrap, [topic])
        handoffs += f", duplicate deliveries {extra(duplicates_of(deliveries))}"
    counts = (
        f"{handoffs}, repeated handler calls {app.repeated_calls(sent)}, "
        f"repeat_skipped {app.logged('repeat delivery skipped')}"
    )
    report(case, result, "; ".join(faults), elapsed, counts)
    assert result.lost == 0, f"{result.lost} messages never handled\n{app.log_tail()}"
    if transactional:
        assert requests, "no retry was handed off"
        assert duplicate_requests == 0, "a failure was handed off twice with transactions"
    assert app.early() == 0, "a retry was handled before it was due"
    assert alive, f"the restarted app died\n{app.log_tail()}"
    assert probed, f"the restarted app does not handle new messages\n{app.log_tail()}"
    assert code == 0
