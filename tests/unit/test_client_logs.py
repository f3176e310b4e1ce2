"""librdkafka's log lines go through redrive's logging, not raw onto stderr."""

from __future__ import annotations

import socket

import pytest
from confluent_kafka import Producer
from structlog.testing import capture_logs

from redrive.client_logs import SILENT, with_client_logs

pytestmark = pytest.mark.unit


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _refused_producer(level: int | None = None) -> Producer:
    config = {"bootstrap.servers": f"127.0.0.1:{_closed_port()}", "message.timeout.ms": 500}
    return Producer(
        with_client_logs(config) if level is None else with_client_logs(config, level=level)
    )


def test_a_client_error_is_a_structured_event_not_a_raw_line(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with capture_logs() as events:
        producer = _refused_producer()
        producer.produce("t", b"v")
        producer.flush(1.5)
    lines = [e for e in events if e["event"] == "librdkafka"]
    assert lines, events
    assert lines[0]["log_level"] == "error"
    assert lines[0]["facility"] == "FAIL"
    assert lines[0]["client"].startswith("rdkafka#producer-")
    assert "Connection refused" in lines[0]["text"]
    assert "%3|" not in capfd.readouterr().err


def test_silent_clients_log_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    with capture_logs() as events:
        producer = _refused_producer(SILENT)
        producer.produce("t", b"v")
        producer.flush(1.5)
    assert [e for e in events if e["event"] == "librdkafka"] == []
    assert "|FAIL|" not in capfd.readouterr().err


def test_the_callers_settings_win() -> None:
    config = with_client_logs({"bootstrap.servers": "b:9092", "log_level": 7})
    assert config["log_level"] == 7
    assert config["bootstrap.servers"] == "b:9092"
    assert hasattr(config["logger"], "log")


def test_a_producer_id_asked_again_is_not_shown_but_other_lines_are() -> None:
    """librdkafka's words, as a broker that just started makes it say them."""
    logger = with_client_logs({})["logger"]
    with capture_logs() as events:
        logger.log(
            30,
            "%s [%s] %s",
            "GETPID",
            "rdkafka#producer-2",
            "[thrd:main]: Failed to acquire transactional PID from broker "
            "TxnCoordinator/1: Broker: Not coordinator: retrying",
        )
        logger.log(30, "%s [%s] %s", "GETPID", "rdkafka#producer-2", "Fatal: giving up")
        logger.log(30, "%s [%s] %s", "FAIL", "rdkafka#producer-2", "broker down: retrying")
    assert [(e["facility"], e["text"]) for e in events] == [
        ("GETPID", "Fatal: giving up"),
        ("FAIL", "broker down: retrying"),
    ]
