"""The retry service's settings: sources, validation, the allowlist."""

from __future__ import annotations

from pathlib import Path

import pytest

from redrive.errors import ConfigError
from redrive.service.config import ServiceSettings, load_settings

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("REDRIVE_"):
            monkeypatch.delenv(name)


def test_environment_beats_yaml_and_yaml_beats_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "redrive.yaml"
    config.write_text(
        "requests_topic: from-yaml\ngroup_id: yaml-group\n"
        "allowed_destinations: [orders, 'items.*']\nkafka:\n  acks: all\n"
    )
    monkeypatch.setenv("REDRIVE_GROUP_ID", "env-group")
    settings = load_settings(config)
    assert settings.requests_topic == "from-yaml"
    assert settings.group_id == "env-group"
    assert settings.kafka == {"acks": "all"}
    assert settings.dlq_topic == "redrive.dlq"


def test_bad_values_name_the_setting_and_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDRIVE_LEASE_SECONDS", "-3")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.setting == "lease_seconds (REDRIVE_LEASE_SECONDS)"
    assert "greater than 0" in info.value.problem


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path / "absent.yaml")
    assert info.value.setting == "--config"


def test_allowlist_globs_and_the_doors_always_closed() -> None:
    settings = ServiceSettings(
        allowed_destinations=["orders", "items.*"], requests_topic="redrive.requests"
    )
    assert settings.destination_allowed("orders")
    assert settings.destination_allowed("items.eu")
    assert not settings.destination_allowed("orders2")
    assert not settings.destination_allowed("payments")
    everything = ServiceSettings(allowed_destinations=["*"])
    assert everything.destination_allowed("anything")
    assert not everything.destination_allowed("__consumer_offsets")
    assert not everything.destination_allowed("redrive.requests")  # no loops


def test_an_allowed_topic_brings_its_groups_retry_topics() -> None:
    # Where Service(ordering="key") delivers: <group>.<topic>.retry, groups and topics
    # with dots in their names too.
    settings = ServiceSettings(
        allowed_destinations=["orders", "items.*"], requests_topic="redrive.requests"
    )
    for allowed in ("billing.orders.retry", "a.b.orders.retry", "g.items.eu.retry"):
        assert settings.destination_allowed(allowed), allowed
    for refused in (
        "orders.retry",  # no group
        ".orders.retry",
        "billing.payments.retry",
        "billing.orders.retry.5m",  # a tier of the topics strategy: not the service's
        "g.redrive.requests.retry",
        "g.__consumer_offsets.retry",
        "billing.orders2.retry",
    ):
        assert not settings.destination_allowed(refused), refused


def test_instance_id_defaults_to_host_and_fixed_port(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: "worker-3.example")
    assert ServiceSettings(http_port=8080).group_instance_id() == "redrive-worker-3.example-8080"
    # Any free port is not stable across restarts, and is no id: dynamic membership.
    assert ServiceSettings(http_port=0).group_instance_id() is None
    monkeypatch.setenv("REDRIVE_INSTANCE_ID", "orders-retry-1")
    assert load_settings(http_port=0).group_instance_id() == "orders-retry-1"
    monkeypatch.setenv("REDRIVE_INSTANCE_ID", "")  # explicitly none
    assert load_settings(http_port=8080).group_instance_id() is None
    # librdkafka's own setting, when given for intake, is the one used.
    explicit = ServiceSettings(intake_kafka={"group.instance.id": "mine"}, instance_id="other")
    assert explicit.group_instance_id() == "mine"


def test_a_host_name_the_broker_would_refuse_is_made_legal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: "host:with spaces" + "x" * 300)
    instance_id = ServiceSettings(http_port=9000).group_instance_id()
    assert instance_id is not None and instance_id.startswith("redrive-host-with-spaces")
    assert instance_id.endswith("-9000") and len(instance_id) <= 249
    assert ServiceSettings(instance_id=instance_id)  # passes the setting's own check


def test_an_illegal_instance_id_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDRIVE_INSTANCE_ID", "two words")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.setting == "instance_id (REDRIVE_INSTANCE_ID)"
    assert "not a legal group instance id" in info.value.problem
