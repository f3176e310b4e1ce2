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
