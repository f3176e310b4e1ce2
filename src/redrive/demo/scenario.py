"""`redrive demo` (`make demo`): the items scenario, end to end, on two engines.

On the embedded default: the local Kafka broker, the embedded PostgreSQL, the retry
service (with its HTTP endpoints and web UI), and two consumers of the same item
events, each with its own consumer group, its own retry topics and its own view of
the items:

- ``[app]``: the items application on the redrive library (``redrive.App``, group
  ``items``, table ``demo_items``), in this process;
- ``[spark]``: a PySpark Structured Streaming query built on ``redrive.spark``
  (``local[2]``, group ``items-spark``, table ``demo_items_spark``).

An `update-item` event arrives before its `create-item`; each engine's update fails
with "item not found", goes through the retry service, comes back on the engine's
own retry topic and is applied once the create has arrived. A malformed event is a
dead letter of each engine, in the one store and web UI of the retry service.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from redrive import App
from redrive.client_logs import with_client_logs
from redrive.deadlines import Deadline
from redrive.demo.items import (
    APP_GROUP,
    CREATE_TOPIC,
    UPDATE_POLICY,
    UPDATE_TOPIC,
    ItemStore,
    build_api,
    build_app,
)
from redrive.demo.spark_engine import (
    MASTER,
    OUTPUT_TOPIC,
    SPARK_GROUP,
    SparkEngine,
    SparkFailed,
    SparkWatcher,
    retry_topics,
)
from redrive.demo.store import SPARK_TABLE
from redrive.local import LocalStack, StackStatus
from redrive.logs import configure
from redrive.partitioners import DEFAULT_PARTITIONER, placed_by
from redrive.policy import Policy, policy
from redrive.ports import free_port, port_in_use
from redrive.service.config import ServiceSettings
from redrive.service.service import RetryService
from redrive.service.store import Store
from redrive.topic_admin import ensure_topic

SERVICE_PORT = 8080
ITEMS_PORT = 9001
SPARK_START_TIMEOUT_S = 150.0
BEFORE_CREATE_S = 20.0
"""Longest wait for both engines' retries before the create: the App's update policy
(2s x5, 5s x3: 25 s of retries) must still have some left when the create arrives."""


def _port(preferred: int) -> int:
    return free_port() if port_in_use(preferred) else preferred


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - http only
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _wait(predicate: Callable[[], bool], within: Deadline) -> bool:
    while not within.passed():
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


class Narrator:
    """Prints what happens, with the time since the scenario began. The numbered
    steps are the scenario's; the lines under them say which engine they are about."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def restart_clock(self) -> None:
        self.started = time.monotonic()

    def __call__(self, text: str) -> None:
        with self._lock:
            self.lines.append(text)
            print(f"  [{time.monotonic() - self.started:5.1f}s] {text}", flush=True)

    def engine(self, name: str) -> Callable[[str], None]:
        prefix = f"   {f'[{name}]':<8}"
        return lambda text: self(prefix + text)

    def count(self, engine: str, text: str) -> int:
        with self._lock:
            return sum(f"[{engine}]" in line and text in line for line in self.lines)

    def app_update_attempt(self, item_id: str) -> int | None:
        """The attempt on which the App applied the item's update (it narrates it)."""
        marker = f"update-item {item_id}: status set to ACTIVE on attempt "
        with self._lock:
            for line in self.lines:
                if "[app]" in line and marker in line:
                    return int(line.rsplit(" ", 1)[-1])
        return None


@dataclass
class Outcome:
    """What one engine did with the scenario's item and malformed event."""

    engine: str
    status: str | None
    retries: int
    attempt: int | None
    dead_letter_type: str | None

    @property
    def ok(self) -> bool:
        return (
            self.status == "ACTIVE"
            and self.retries >= 1
            and self.attempt is not None
            and self.attempt > 1
            and self.dead_letter_type is not None
        )

    def lines(self, short_id: str) -> list[str]:
        tag = f"[{self.engine}]"
        retries = f"{self.retries} retr{'y' if self.retries == 1 else 'ies'}"
        applied = (
            f"applied on attempt {self.attempt}" if self.attempt else "the update never applied"
        )
        dead = (
            f"the malformed event is a dead letter ({self.dead_letter_type})"
            if self.dead_letter_type
            else "the malformed event is NOT in the dead letters"
        )
        return [
            f"  {tag:<8} item {short_id} is {self.status or 'missing'}: {applied}, after"
            f" {retries} through the retry service;",
            f"           {dead}",
        ]


@dataclass
class Running:
    """Everything the demo started, so that it can all be stopped whatever happened."""

    engine: SparkEngine
    service: RetryService | None = None
    app: App | None = None
    app_thread: threading.Thread | None = None
    api: uvicorn.Server | None = None
    watcher: SparkWatcher | None = None
    producers: list[Producer] = field(default_factory=list)

    def stop(self) -> None:
        # The query first: it writes requests the service would otherwise get after
        # it stopped; then the rest, each on its own.
        if self.watcher is not None:
            self.watcher.stop()
        self.engine.stop()
        if self.app is not None:
            self.app.stop()
        if self.app_thread is not None:
            self.app_thread.join(30)
        if self.api is not None:
            self.api.should_exit = True
        if self.service is not None:
            self.service.stop()
        for producer in self.producers:
            producer.flush(5)


def _create_topics(bootstrap: str) -> None:
    admin = AdminClient(with_client_logs({"bootstrap.servers": bootstrap}))
    # The App creates its own retry topics; the Spark query's sink creates none.
    for topic in (CREATE_TOPIC, UPDATE_TOPIC, *retry_topics(SPARK_GROUP)):
        ensure_topic(admin, topic, 3, {})
    ensure_topic(admin, OUTPUT_TOPIC, 1, {})


def _settings(status: StackStatus) -> ServiceSettings:
    return ServiceSettings(
        bootstrap=status.bootstrap,
        database_url=status.database_url,
        # Where retries may be sent: each engine's own retry topics; and the item
        # topics, which dead letters name (a replay sends them there).
        allowed_destinations=[
            CREATE_TOPIC,
            UPDATE_TOPIC,
            *retry_topics(APP_GROUP),
            *retry_topics(SPARK_GROUP),
        ],
    )


def _introduce(service_url: str, items_url: str, engine: SparkEngine) -> None:
    print(f"retry service and web UI  {service_url}/")
    print(f"items API                 {items_url}")
    print(f"Spark's log               {engine.log_path}")
    print()
    print("Two engines consume the same create-item and update-item events, each in its")
    print("own consumer group, with its own view of the items and its own retry topics:")
    print(f"  [app]    redrive.App, in this process          group {APP_GROUP}")
    print(f"  [spark]  a PySpark Structured Streaming query  group {SPARK_GROUP} (Spark {MASTER})")
    print("           built on redrive.spark")
    print("Both send their retries and dead letters to the one retry service.\n", flush=True)


def _point_to_the_ui(service_url: str) -> None:
    print(f"web UI: {service_url}/")
    print("  Overview: the malformed event is under 'Dead letters by error type' twice, as")
    print(f"  redrive.DeserializationError (the App, group {APP_GROUP}) and as")
    print(f"  json.decoder.JSONDecodeError (the Spark query, group {SPARK_GROUP}). Click one,")
    print("  then open the letter to see its raw value, the stack trace and the Replay /")
    print("  Delete actions (these need an operator token: redrive token create me --role")
    print("  operator, then Sign in).")
    print(f"REST API: {service_url}/docs   metrics: {service_url}/metrics")


def _play(
    *,
    producer: Producer,
    status_url: str,
    stores: dict[str, ItemStore],
    service_store: Store,
    watcher: SparkWatcher,
    say: Narrator,
) -> list[Outcome]:
    """The three steps of the scenario; returns each engine's outcome."""
    say_app, say_spark = say.engine("app"), say.engine("spark")
    item_id = str(uuid.uuid4())
    short = f"{item_id[:8]}…"
    key = item_id.encode()
    app_url, spark_url = status_url.format(item_id), status_url.format(item_id) + "?engine=spark"

    say.restart_clock()
    say(f"1. update-item {item_id} (status ACTIVE) is produced before its create-item")
    code, _ = _get(app_url)
    say_app(f"GET /v1/demo/items/{short}/status -> {code} (the item does not exist)")
    code, _ = _get(spark_url)
    say_spark(f"GET /v1/demo/items/{short}/status?engine=spark -> {code} (the item does not exist)")
    producer.produce(
        UPDATE_TOPIC, key=key, value=json.dumps({"id": item_id, "status": "ACTIVE"}).encode()
    )
    producer.flush(10)

    def app_retries() -> int:
        return say.count("app", f"item {item_id} not found")

    # Let each engine fail twice, so that the retries can be seen, before the create.
    # On the wall clock: the create must come while the App's policy has retries left.
    _wait(
        lambda: app_retries() >= 2 and watcher.retries[key] >= 2,
        Deadline(BEFORE_CREATE_S, max_stretch=1.0),
    )
    time.sleep(0.5)

    say(f"2. create-item {item_id} is produced")
    producer.produce(
        CREATE_TOPIC, key=key, value=json.dumps({"id": item_id, "name": "my-new-item"}).encode()
    )
    producer.flush(10)
    _wait(
        lambda: (
            stores["app"].status(item_id) == "ACTIVE"
            and watcher.applied_attempt(item_id, UPDATE_TOPIC) is not None
        ),
        Deadline(60),
    )
    code, body = _get(app_url)
    say_app(f"GET /v1/demo/items/{short}/status -> {code} {body}")
    code, body = _get(spark_url)
    say_spark(f"GET /v1/demo/items/{short}/status?engine=spark -> {code} {body}")

    bad_key = f"malformed-{item_id[:8]}".encode()
    say("3. a malformed update-item event (not JSON) is produced")
    producer.produce(UPDATE_TOPIC, key=bad_key, value=b"{this is not json")
    producer.flush(10)

    def dead_letter_types() -> dict[str, str]:
        return {
            row["group_id"]: row["error_type"]
            for row in service_store.dead_letters()
            if row["msg_key"] == bad_key
        }

    _wait(lambda: {APP_GROUP, SPARK_GROUP} <= set(dead_letter_types()), Deadline(60))
    dead = dead_letter_types()
    for group, tell in ((APP_GROUP, say_app), (SPARK_GROUP, say_spark)):
        tell(
            f"it is a dead letter in the retry service's store ({dead[group]})"
            if group in dead
            else "its dead letter did not arrive in the retry service's store"
        )

    outcomes = [
        Outcome(
            "app",
            stores["app"].status(item_id),
            app_retries(),
            say.app_update_attempt(item_id),
            dead.get(APP_GROUP),
        ),
        Outcome(
            "spark",
            stores["spark"].status(item_id),
            watcher.retries[key],
            watcher.applied_attempt(item_id, UPDATE_TOPIC),
            dead.get(SPARK_GROUP),
        ),
    ]
    print()
    print("outcome:")
    for outcome in outcomes:
        for line in outcome.lines(short):
            print(line)
    print()
    return outcomes


def _stop_on_signals() -> None:
    """Ctrl-C and SIGTERM stop the demo (the Spark query and its checkpoint too).

    SIGINT's handler is installed too, not left to Python's default: a process started
    with SIGINT ignored (a shell's background job, and whatever it starts) keeps it
    ignored, and Ctrl-C would then never reach the demo."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)
        signal.signal(signal.SIGINT, interrupt)


def run(*, oneshot: bool = False) -> int:
    print(
        "redrive demo: the items scenario on the embedded default, on two engines\n",
        flush=True,
    )
    status = LocalStack().up()
    configure("console", level=logging.ERROR)  # the narration, not the logs
    _create_topics(status.bootstrap)
    settings = _settings(status)
    update_policy: Policy = policy(UPDATE_POLICY)
    stores = {
        "app": ItemStore(status.database_url),
        "spark": ItemStore(status.database_url, SPARK_TABLE),
    }
    say = Narrator()
    running = Running(
        SparkEngine(
            bootstrap=status.bootstrap,
            database_url=status.database_url,
            requests_topic=settings.requests_topic,
            policy=update_policy,
            folder=status.state_dir / "demo" / "spark",
            start_timeout_s=SPARK_START_TIMEOUT_S,
        )
    )
    try:
        _stop_on_signals()
        print(f"starting Spark ({MASTER}) and its query …", flush=True)
        spark_started = time.monotonic()
        # First, with nothing else running: the JVM inherits this process's output
        # while it starts (see SparkEngine.start).
        running.engine.start()

        # The port is chosen as the service starts, not before Spark's minute of
        # start-up, when another program may take it meanwhile.
        running.service = service = RetryService(
            settings.model_copy(update={"http_port": _port(SERVICE_PORT)})
        )
        service.start()
        running.app = app = build_app(
            status.bootstrap,
            stores["app"],
            requests_topic=settings.requests_topic,
            say=say.engine("app"),
        )
        running.app_thread = threading.Thread(
            target=lambda: app.run(install_signal_handlers=False), name="items", daemon=True
        )
        running.app_thread.start()
        items_port = _port(ITEMS_PORT)
        running.api = api = uvicorn.Server(
            uvicorn.Config(
                build_api(stores["app"], stores["spark"]),
                host="127.0.0.1",
                port=items_port,
                log_level="warning",
            )
        )
        threading.Thread(target=api.run, name="items-api", daemon=True).start()
        running.engine.wait_until_ready()
        print(f"Spark is ready ({time.monotonic() - spark_started:.0f}s)\n", flush=True)
        running.watcher = watcher = SparkWatcher(
            status.bootstrap, settings.requests_topic, update_policy, say.engine("spark")
        )
        watcher.start()
        _wait(lambda: app.running.is_set() and api.started, Deadline(30))
        service_url = f"http://127.0.0.1:{service.http_port}"
        items_url = f"http://127.0.0.1:{items_port}"
        _introduce(service_url, items_url, running.engine)

        # The items' events are keyed by item: placed as the App's own hand-offs are.
        producer = Producer(
            with_client_logs(
                {"bootstrap.servers": status.bootstrap, **placed_by(DEFAULT_PARTITIONER)}
            )
        )
        running.producers.append(producer)
        assert service.store is not None  # started above
        outcomes = _play(
            producer=producer,
            status_url=f"{items_url}/v1/demo/items/{{}}/status",
            stores=stores,
            service_store=service.store,
            watcher=watcher,
            say=say,
        )
        _point_to_the_ui(service_url)
        if oneshot:
            passed = all(outcome.ok for outcome in outcomes)
            print("demo passed" if passed else "demo FAILED", flush=True)
            return 0 if passed else 1
        print(
            "\nRunning until Ctrl-C (produce more events with kcat to see both engines"
            " handle them).",
            flush=True,
        )
        threading.Event().wait()
        return 0
    except SparkFailed as exc:
        print(f"demo FAILED: {exc}", flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: just go
            running.stop()
