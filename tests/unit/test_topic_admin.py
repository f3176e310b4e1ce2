"""Creating topics at start-up: a refused login is told at once, silence after a while."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient

from redrive.topic_admin import LoginWatch, ensure_topic


def test_the_login_watch_keeps_the_first_refused_login_and_nothing_else() -> None:
    login = LoginWatch()
    login(KafkaError(KafkaError._TRANSPORT, "1/1 brokers are down"))
    assert login.refused is None  # a broker not up yet may still come
    first = KafkaError(KafkaError._AUTHENTICATION, "invalid credentials")
    login(first)
    login(KafkaError(KafkaError._AUTHENTICATION, "again"))
    assert login.refused is first


def test_a_broker_that_never_answers_is_reported_once_the_timeout_passed() -> None:
    # Nothing listens on port 1: the request waits for a broker until the timeout.
    login = LoginWatch()
    admin = AdminClient({"bootstrap.servers": "127.0.0.1:1", "error_cb": login, "log_level": 0})
    with pytest.raises(TimeoutError, match="no answer from the broker within 1 s"):
        ensure_topic(admin, "t", 1, {}, login=login, timeout_s=1)
    assert login.refused is None
