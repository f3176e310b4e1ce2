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

The App cases count as sent only what the source topic holds once the load stopped:
a record the load's producer saw acknowledged that the topic does not hold never
reached the App (redrive never removes a record from a source topic), so it is
printed apart ("acknowledged but not in the topic"), not counted as redrive's loss.

`REDRIVE_CHAOS=long` runs the long mode (bigger load, more kills, longer outages);
`REDRIVE_CHAOS_SEED=N` repeats a run's randomness. Each test prints one line
`[chaos <case>] mode=... seed=...: sent S, received R, lost L, duplicates D; ...`,
the app cases with the counts above after D.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.chaos.fault_checks import (
    APP_STRATEGIES,
    collect_all,
    early_deliveries,
    fault_times,
    kill_service,
    probe_app,
    probe_service,
    repeats_explained,
    requests_to,
)
from tests.chaos.harness import (
    FAST_GROUP,
    LONG,
    MODE,
    AppProcess,
    Service,
    app_records,
    committed_requests,
    duplicates_of,
    extra,
    not_in_topic,
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
    fresh_database,
    pending_count,
    settings_for,
)

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.integration,
    pytest.mark.timeout(MODE.test_timeout_s),
]


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
        unstored = not_in_topic(bootstrap, topic, load.finish())
        sent = load.sent - unstored
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
        f"repeat_skipped {skipped}, repeated handler calls {app.repeated_calls(sent)}, "
        f"acknowledged but not in the topic {sorted(unstored)}"
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
            unstored = not_in_topic(bootstrap, topic, load.finish())
            sent = load.sent - unstored
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
        f"repeat_skipped {app.logged('repeat delivery skipped')}, "
        f"acknowledged but not in the topic {sorted(unstored)}"
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
