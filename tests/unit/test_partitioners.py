"""The partitioner setting: one typed choice, Java's placement unless told otherwise,
given once (never also as a raw librdkafka setting), a bad one refused naming it.

Where the producers then put records is the integration tests' business
(tests/integration/test_placement.py), on a real broker.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

from redrive import App
from redrive.consumer.clients import PARTITIONER_SETTING
from redrive.errors import ConfigError
from redrive.partitioners import (
    DEFAULT_PARTITIONER,
    Partitioner,
    PartitionerName,
    java_sink_places,
    partitioner_named,
    placed_by,
    raw_partitioner,
)
from redrive.service.config import ServiceSettings, load_settings

pytestmark = pytest.mark.unit

SERVICE_DOC = Path(__file__).resolve().parents[2] / "docs" / "retry-service.md"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("REDRIVE_"):
            monkeypatch.delenv(name)
    # load_settings(file) names the file in REDRIVE_CONFIG: undone after the test.
    monkeypatch.setenv("REDRIVE_CONFIG", "")


def test_the_names_are_the_members_and_the_default_is_javas() -> None:
    assert get_args(PartitionerName) == tuple(p.value for p in Partitioner)
    assert DEFAULT_PARTITIONER is Partitioner.MURMUR2_RANDOM
    assert placed_by(Partitioner.CONSISTENT_RANDOM) == {"partitioner": "consistent_random"}


@pytest.mark.parametrize("value", ["murmur2_random", Partitioner.FNV1A, "consistent"])
def test_a_partitioner_is_taken_by_name_or_member(value: str) -> None:
    assert partitioner_named(value, "here") == Partitioner(value)


@pytest.mark.parametrize("value", ["random", "crc32", "MURMUR2_RANDOM", "", None, 2])
def test_anything_else_is_refused_naming_the_setting(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        partitioner_named(value, "the setting")
    assert info.value.setting == "the setting"
    assert repr(value) in info.value.problem
    assert "murmur2_random" in info.value.fix


def test_librdkafkas_own_spellings_of_the_setting_are_found() -> None:
    assert raw_partitioner({"acks": "all"}) is None
    assert raw_partitioner({"partitioner": "random"}) == "partitioner"
    assert raw_partitioner({"topic.partitioner": "random"}) == "topic.partitioner"
    nested = {"default.topic.config": {"partitioner": "random"}}
    assert raw_partitioner(nested) == "default.topic.config.partitioner"


def test_the_app_places_by_java_unless_told_otherwise() -> None:
    assert App("127.0.0.1:1").settings.partitioner is Partitioner.MURMUR2_RANDOM
    chosen = App("127.0.0.1:1", partitioner="consistent_random")
    assert chosen.settings.partitioner is Partitioner.CONSISTENT_RANDOM


def test_the_app_refuses_a_bad_partitioner_and_a_raw_one() -> None:
    with pytest.raises(ConfigError) as info:
        App("127.0.0.1:1", partitioner="crc32")  # type: ignore[arg-type]
    assert info.value.setting == PARTITIONER_SETTING == "App(partitioner=...)"
    with pytest.raises(ConfigError) as raw:
        App("127.0.0.1:1", kafka={"partitioner": "murmur2_random"})
    assert raw.value.setting == "App(kafka=...)"
    assert "'partitioner'" in raw.value.problem and PARTITIONER_SETTING in raw.value.fix


def test_the_service_places_by_java_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ServiceSettings().partitioner is Partitioner.MURMUR2_RANDOM
    config = tmp_path / "redrive.yaml"
    config.write_text("partitioner: fnv1a_random\n")
    assert load_settings(config).partitioner is Partitioner.FNV1A_RANDOM
    monkeypatch.setenv("REDRIVE_PARTITIONER", "consistent_random")  # beats the file
    assert load_settings(config).partitioner is Partitioner.CONSISTENT_RANDOM
    assert load_settings(partitioner="murmur2").partitioner is Partitioner.MURMUR2  # the CLI's


@pytest.mark.parametrize("value", ["crc32", "random", "Murmur2_Random"])
def test_the_service_refuses_a_bad_partitioner_naming_it(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDRIVE_PARTITIONER", value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.setting == "partitioner (REDRIVE_PARTITIONER)"
    assert "'murmur2_random'" in info.value.problem and repr(value) in info.value.problem


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("REDRIVE_KAFKA", '{"partitioner": "murmur2_random"}'),
        ("REDRIVE_SCHEDULER_KAFKA", '{"topic.partitioner": "consistent"}'),
    ],
)
def test_the_service_refuses_a_raw_partitioner_among_client_settings(
    variable: str, raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, raw)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.setting == f"{variable.removeprefix('REDRIVE_').lower()} ({variable})"
    assert "REDRIVE_PARTITIONER" in info.value.problem


def test_the_spark_commands_refuse_a_placement_the_java_producer_cannot_follow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    java_sink_places(Partitioner.MURMUR2_RANDOM, "here")  # Java's own: nothing to say
    with pytest.raises(ConfigError) as info:
        java_sink_places(Partitioner.MURMUR2, "here")
    assert info.value.setting == "here" and "murmur2_random" in info.value.fix
    # The Spark commands read the service's settings: its partitioner is checked first.
    from typer.testing import CliRunner

    from redrive.cli import app

    monkeypatch.setenv("REDRIVE_PARTITIONER", "consistent_random")
    checkpoint = str(tmp_path / "checkpoint")
    args = ["spark", "scheduler", "--checkpoint", checkpoint, "--bootstrap", "127.0.0.1:1"]
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, ConfigError), result.output
    assert result.exception.setting == "partitioner (REDRIVE_PARTITIONER)"
    assert "'consistent_random'" in result.exception.problem


def test_the_service_docs_examples_configure_and_refuse_what_they_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    section = SERVICE_DOC.read_text().split("\n## Where records land\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    [yaml] = re.findall(r"```yaml\n(.*?)```", section, flags=re.DOTALL)
    config = tmp_path / "redrive.yaml"
    config.write_text(yaml)
    assert load_settings(config).partitioner is Partitioner.CONSISTENT_RANDOM
    [console] = re.findall(r"```console\n(.*?)```", section, flags=re.DOTALL)
    command, *printed = console.splitlines()
    assert command == "$ REDRIVE_PARTITIONER=crc32 redrive serve"
    monkeypatch.delenv("REDRIVE_CONFIG", raising=False)
    monkeypatch.setenv("REDRIVE_PARTITIONER", "crc32")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert printed == f"redrive: {info.value}".splitlines()  # as `redrive serve` prints it
