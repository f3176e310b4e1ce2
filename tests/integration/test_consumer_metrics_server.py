"""`App(metrics_port=...)`: /metrics and /healthz over real HTTP while the App runs.

The App's own registry is what /metrics serves, with the counts its records made;
/healthz is 200 while the loop runs and polls, 503 once a stop was asked for or the
loop failed (and when it stalls); the port is closed and the server thread gone once
the App stopped; a port in use stops the App before it consumes. Against the real
broker, scraped with urllib; the example of docs/consumer.md runs too.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from redrive import App, FatalError, Message
from redrive.errors import ConfigError
from redrive.ports import port_in_use
from tests.integration.consumer_harness import docs_example, in_thread, running_app, running_example
from tests.integration.service_harness import produce, wait_until

integration = pytest.mark.integration
FAMILIES = {
    "redrive_consumer_records": "counter",
    "redrive_consumer_handler_seconds": "counter",
    "redrive_consumer_waiting_partitions": "gauge",
    "redrive_consumer_breaker_state": "gauge",
    "redrive_consumer_dead_letter_brake_state": "gauge",
    "redrive_consumer_dead_letter_brake_openings": "counter",
}


class Flaky(Exception):
    pass


def a_group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def get(url: str, accept: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of a GET, whatever the status."""
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers), error.read()


def health(app: App) -> tuple[int, dict[str, Any]]:
    assert app.health_url is not None
    status, headers, body = get(app.health_url)
    assert headers["Content-Type"] == "application/json"
    return status, json.loads(body)


def scrape(app: App) -> dict[str, Any]:
    """The metric families /metrics serves, parsed by prometheus_client."""
    assert app.metrics_url is not None
    status, headers, body = get(app.metrics_url)
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=")
    return {family.name: family for family in text_string_to_metric_families(body.decode())}


def value(families: dict[str, Any], family: str, sample: str, **labels: str) -> float | None:
    for s in families[family].samples if family in families else []:
        if s.name == sample and s.labels == labels:
            return float(s.value)
    return None


def records(app: App, topic: str, outcome: str) -> float | None:
    family, sample = "redrive_consumer_records", "redrive_consumer_records_total"
    return value(scrape(app), family, sample, topic=topic, outcome=outcome)


def port_of(app: App) -> int:
    """The port the App's metrics server is bound to (it was given 0)."""
    assert app.metrics_url is not None
    port = urllib.parse.urlsplit(app.metrics_url).port
    assert port is not None
    return port


def refused(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5).close()
    except urllib.error.URLError as error:
        return isinstance(error.reason, ConnectionRefusedError)
    return False


def server_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("redrive-metrics")]


def assert_closed(url: str, port: int) -> None:
    """Nothing listens on the port any more, and no server thread is left."""
    assert refused(url), f"{url} still answers after the App stopped"
    assert not port_in_use(port)
    assert server_threads() == []


@contextmanager
def app_thread(app: App) -> Iterator[list[BaseException]]:
    """Run the App in a thread that may raise; yields what it raised (once joined)."""
    thread, errors = in_thread(lambda: app.run(install_signal_handlers=False), "test-app")
    try:
        yield errors
    finally:
        app.stop()
        thread.join(60)
        assert not thread.is_alive(), "the app did not stop"


@contextmanager
def releasing(held: threading.Event) -> Iterator[None]:
    """Set `held` on the way out, failed or not: what waits on it must not wait out its
    timeout when an assertion failed first."""
    try:
        yield
    finally:
        held.set()


# ------------------------------------------------------------------ serving


@integration
def test_metrics_and_health_are_served_while_the_app_runs(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("metrics-http", partitions=2)

    def handler(message: Message) -> None:
        if message.raw_value == b"fatal":
            raise FatalError("never")
        if message.raw_value == b"flaky" and message.attempt == 1:
            raise Flaky("once")

    app = App(bootstrap, group=a_group(), metrics_port=0)
    app.add_handler(topic, handler, policy="100ms x3", strategy="blocking")
    assert app.metrics_url is None and app.health_url is None

    with running_app(app):
        assert app.metrics_url is not None and app.health_url is not None
        url, port = app.metrics_url, port_of(app)
        assert port != 0 and url == f"http://127.0.0.1:{port}/metrics"
        assert app.health_url == f"http://127.0.0.1:{port}/healthz"
        assert server_threads() == [f"redrive-metrics-{port}"]

        values = [b"ok-1", b"ok-2", b"ok-3", b"flaky", b"fatal"]
        produce(bootstrap, topic, [{"key": v, "value": v} for v in values])
        expected = {"handled": 4.0, "retried": 1.0, "dead_lettered": 1.0}
        wait_until(
            lambda: {o: records(app, topic, o) for o in expected} == expected,
            30,
            f"/metrics to count {expected}",
        )
        wait_until(lambda: health(app)[1]["assigned_partitions"] == 2, 30, "2 partitions")

        families = scrape(app)
        assert {name: families[name].type for name in FAMILIES} == FAMILIES
        totals = {
            s.labels["outcome"]: s.value
            for s in families["redrive_consumer_records"].samples
            if s.name == "redrive_consumer_records_total"
        }
        assert totals == expected
        seconds = value(
            families, "redrive_consumer_handler_seconds", "redrive_consumer_handler_seconds_total"
        )
        assert seconds is not None and seconds > 0
        waiting = "redrive_consumer_waiting_partitions"
        assert value(families, waiting, waiting) == 0.0
        # The App's own registry, not prometheus_client's global one (python_info,
        # process_*, python_gc_*); the text format shows each counter's _created apart.
        assert {name.removesuffix("_created") for name in families} == set(FAMILIES)
        registry = app.metrics.registry
        for outcome, count in expected.items():
            labels = {"topic": topic, "outcome": outcome}
            assert registry.get_sample_value("redrive_consumer_records_total", labels) == count
        # prometheus_client's app: the exposition format follows the Accept header.
        status, headers, body = get(url, accept="application/openmetrics-text")
        assert status == 200 and headers["Content-Type"].startswith("application/openmetrics")
        assert body.endswith(b"# EOF\n")

        status, body = health(app)
        assert status == 200
        assert body["status"] == "ok" and body["group"] == app.group
        assert body["assigned_partitions"] == 2 and body["seconds_since_poll"] < 5
        assert get(f"http://127.0.0.1:{port}/")[0] == 404

    assert app.metrics_url is None and app.health_url is None
    assert_closed(url, port)


@integration
def test_health_judges_the_loop_a_busy_handler_a_stall_and_a_stop(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("metrics-health")
    entered, release = threading.Event(), threading.Event()

    def handler(message: Message) -> None:
        entered.set()
        assert release.wait(60)

    app = App(bootstrap, group=a_group(), metrics_port=0)
    app.add_handler(topic, handler, strategy="blocking")
    with running_app(app), releasing(release):
        assert health(app)[0] == 200
        produce(bootstrap, topic, [{"value": b"slow"}])
        assert entered.wait(30)
        # Busy in a handler is healthy; past max.poll.interval.ms (300 s) it is not.
        assert health(app)[0] == 200
        stalled = app.health(now=time.monotonic() + 301)
        assert not stalled.ok
        assert re.fullmatch(
            r"stalled: no poll for 30\d\.\d s, max.poll.interval.ms is 300000",
            str(stalled.detail["reason"]),
        )

        app.stop()  # the handler still holds the loop: stopping, not yet stopped
        status, body = health(app)
        assert (status, body["status"], body["reason"]) == (503, "unavailable", "stopping")
        assert app.metrics_url is not None
        url, port = app.metrics_url, port_of(app)
    assert_closed(url, port)


@integration
def test_a_failed_loop_answers_503_until_the_app_has_shut_down(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("metrics-failed")
    app = App(bootstrap, group=a_group(), metrics_port=0)
    app.add_handler(topic, lambda message: None, strategy="blocking")

    def broken_poll() -> None:
        raise RuntimeError("broker on fire")

    # Hold the App in its shutdown (commit, close) to ask /healthz meanwhile.
    shutting_down, release = threading.Event(), threading.Event()
    shutdown = app._shutdown

    def held_shutdown() -> None:
        shutting_down.set()
        assert release.wait(60)
        shutdown()

    app._poll_once = broken_poll  # type: ignore[method-assign]
    app._shutdown = held_shutdown  # type: ignore[method-assign]
    with app_thread(app) as errors, releasing(release):
        assert shutting_down.wait(30)
        assert app.metrics_url is not None
        url, port = app.metrics_url, port_of(app)
        status, body = health(app)
        assert (status, body["reason"]) == (503, "loop failed: RuntimeError: broker on fire")
    assert [str(e) for e in errors] == ["broker on fire"]
    assert_closed(url, port)


# ------------------------------------------------------------------ start-up errors


@integration
def test_a_port_in_use_stops_the_app_before_it_consumes(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("metrics-taken")
    called: list[Message] = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        app = App(bootstrap, group=a_group(), metrics_port=port)
        app.add_handler(topic, called.append, strategy="blocking")
        produce(bootstrap, topic, [{"value": b"not to be read"}])
        with app_thread(app) as errors:
            wait_until(lambda: bool(errors), 30, "run() to fail")
        [error] = errors
        assert isinstance(error, ConfigError)
        assert error.setting == f"App(metrics_port={port})"
        assert error.problem.startswith(f"127.0.0.1:{port} is already in use by ")
        assert "metrics_port=0" in error.fix
        assert str(error).startswith(f"App(metrics_port={port}): 127.0.0.1:{port} is already")
        assert "\n  fix: choose another port" in str(error)
        # Failed before Kafka: no consumer made, never running, nothing handled.
        assert app._session is None and not app.running.is_set()
        assert called == [] and app.metrics_url is None and server_threads() == []
        assert port_in_use(port)  # still ours


@pytest.mark.unit
@pytest.mark.parametrize("port", [-1, 65536, True, "9464", 9464.0])
def test_a_port_that_cannot_be_one_is_refused_when_the_app_is_made(port: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        App("localhost:1", metrics_port=port)
    assert caught.value.setting == "App(metrics_port=...)"
    assert caught.value.problem == f"{port!r} is not a TCP port"
    assert "0 for any free port" in caught.value.fix


@pytest.mark.unit
def test_an_empty_host_is_refused_when_the_app_is_made() -> None:
    with pytest.raises(ConfigError, match=r"App\(metrics_host=\.\.\.\): '' is not a host"):
        App("localhost:1", metrics_port=0, metrics_host="")
    assert App("localhost:1", metrics_port=65535).metrics_port == 65535
    assert App("localhost:1").metrics_port is None


# ------------------------------------------------------------------ the docs


@integration
def test_the_docs_example_serves_its_metrics(bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic("metrics-docs")
    source = docs_example(
        "## Metrics over HTTP",
        {
            '"localhost:9092"': repr(bootstrap),
            "metrics_port=9464": "metrics_port=0",
            '"orders"': repr(topic),
            '"billing"': repr(a_group()),
        },
    )
    with running_example(source) as example:
        app: App = example["app"]
        produce(bootstrap, topic, [{"key": b"order-1", "value": b"{}"}])
        wait_until(lambda: records(app, topic, "handled") == 1.0, 30, "the order handled")
        assert health(app)[0] == 200
