"""`redrive demo` (`make demo`): the items scenario of seed 000, end to end.

On the embedded default: the local Kafka broker, the embedded PostgreSQL, the retry
service (with its HTTP endpoints), and the items application built on the redrive
library. An `update-item` event arrives before its `create-item`; the update fails
with "item not found", goes through the retry service, and is applied once the
create has arrived. A malformed event lands in the dead letters.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable

import uvicorn
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from redrive.client_logs import with_client_logs
from redrive.demo.items import CREATE_TOPIC, UPDATE_TOPIC, ItemStore, build_api, build_app
from redrive.local import LocalStack
from redrive.local.process import free_port, port_in_use
from redrive.logs import configure
from redrive.service.config import ServiceSettings
from redrive.service.service import RetryService
from redrive.service.topics import ensure_topic

SERVICE_PORT = 8080
ITEMS_PORT = 9001


def _port(preferred: int) -> int:
    return free_port() if port_in_use(preferred) else preferred


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - http only
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def _wait(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


class Narrator:
    """Prints what happens, with the time since the scenario began."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, text: str) -> None:
        with self._lock:
            self.lines.append(text)
            print(f"  [{time.monotonic() - self.started:5.1f}s] {text}", flush=True)


def run(*, oneshot: bool = False) -> int:
    print("redrive demo: the items scenario (seed 000) on the embedded default\n", flush=True)
    status = LocalStack().up()
    configure("console", level=logging.ERROR)  # the narration, not the logs
    admin = AdminClient(with_client_logs({"bootstrap.servers": status.bootstrap}))
    for topic in (CREATE_TOPIC, UPDATE_TOPIC):
        ensure_topic(admin, topic, 3, {})

    settings = ServiceSettings(
        bootstrap=status.bootstrap,
        database_url=status.database_url,
        allowed_destinations=[CREATE_TOPIC, UPDATE_TOPIC],
        http_port=_port(SERVICE_PORT),
    )
    service = RetryService(settings)
    service.start()
    say = Narrator()
    store = ItemStore(status.database_url)
    app = build_app(status.bootstrap, store, requests_topic=settings.requests_topic, say=say)
    app_thread = threading.Thread(
        target=lambda: app.run(install_signal_handlers=False), name="items", daemon=True
    )
    app_thread.start()
    items_port = _port(ITEMS_PORT)
    api = uvicorn.Server(
        uvicorn.Config(build_api(store), host="127.0.0.1", port=items_port, log_level="warning")
    )
    threading.Thread(target=api.run, name="items-api", daemon=True).start()
    _wait(lambda: app.running.is_set() and api.started, 30)
    service_url = f"http://127.0.0.1:{service.http_port}"
    status_url = f"http://127.0.0.1:{items_port}/v1/demo/items/{{}}/status"
    print(f"retry service and web UI  {service_url}/")
    print(f"items API                 http://127.0.0.1:{items_port}\n")

    producer = Producer(with_client_logs({"bootstrap.servers": status.bootstrap}))
    item_id = str(uuid.uuid4())
    key = item_id.encode()
    ok = True
    try:
        say(f"1. update-item {item_id} (status ACTIVE) is produced before its create-item")
        producer.produce(
            UPDATE_TOPIC, key=key, value=json.dumps({"id": item_id, "status": "ACTIVE"}).encode()
        )
        producer.flush(10)
        code, _ = _get(status_url.format(item_id))
        say(f"   GET /v1/demo/items/{item_id[:8]}…/status -> {code} (the item does not exist)")
        # Let it fail twice, so the retries can be seen, before the create arrives.
        _wait(lambda: sum("brings it back" in line for line in say.lines) >= 2, 20)
        time.sleep(0.5)

        say(f"2. create-item {item_id} is produced")
        producer.produce(
            CREATE_TOPIC, key=key, value=json.dumps({"id": item_id, "name": "my-new-item"}).encode()
        )
        producer.flush(10)
        applied = _wait(lambda: store.status(item_id) == "ACTIVE", 40)
        code, body = _get(status_url.format(item_id))
        say(f"   GET /v1/demo/items/{item_id[:8]}…/status -> {code} {body}")
        ok &= applied and code == 200 and json.loads(body)["status"] == "ACTIVE"

        bad_key = f"malformed-{item_id[:8]}".encode()
        say("3. a malformed update-item event (not JSON) is produced")
        producer.produce(UPDATE_TOPIC, key=bad_key, value=b"{this is not json")
        producer.flush(10)
        store_of_service = service.store
        assert store_of_service is not None  # started above

        def dead_letter_stored() -> bool:
            return any(r["msg_key"] == bad_key for r in store_of_service.dead_letters())

        dead = _wait(dead_letter_stored, 30)
        say(
            "   it is a dead letter in the retry service's store"
            if dead
            else "   the dead letter did not arrive"
        )
        ok &= dead
        retries = sum("brings it back" in line for line in say.lines)
        ok &= retries >= 1
        print()
        print(
            f"outcome: item {item_id} is ACTIVE after {retries} "
            f"retr{'y' if retries == 1 else 'ies'}"
            " through the retry service; the malformed event is a dead letter."
        )
        print()
        print(f"web UI: {service_url}/")
        print("  Overview: the malformed event is under 'Dead letters by error type' as")
        print("  redrive.DeserializationError; click it, then open the letter to see its raw")
        print("  value, the stack trace and the Replay / Delete actions (these need an operator")
        print("  token: redrive token create me --role operator, then Sign in).")
        print(f"REST API: {service_url}/docs   metrics: {service_url}/metrics")
        if oneshot:
            print("demo passed" if ok else "demo FAILED")
            return 0 if ok else 1
        print("\nRunning until Ctrl-C (produce more events with kcat to see them handled).")
        threading.Event().wait()
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        app.stop()
        app_thread.join(30)
        api.should_exit = True
        service.stop()
        producer.flush(5)
