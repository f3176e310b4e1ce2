"""docs/retry-service.md "Throughput": its YAML is a valid `redrive serve` config, and
it is what benchmark 2 runs the service with (the docs say so)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from redrive.service.config import load_settings

ROOT = Path(__file__).resolve().parents[2]


def _throughput_yaml() -> str:
    text = (ROOT / "docs" / "retry-service.md").read_text()
    section = text.split("## Throughput", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert match, "the Throughput section has no YAML example"
    return match.group(1)


def test_the_documented_tuning_loads_and_is_what_benchmark_2_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "redrive.yaml"
    config.write_text(_throughput_yaml())
    monkeypatch.delenv("REDRIVE_CONFIG", raising=False)  # load_settings sets it
    settings = load_settings(config)
    monkeypatch.syspath_prepend(str(ROOT))
    kafka_raw = importlib.import_module("bench.kafka_raw")
    service = importlib.import_module("bench.service")
    assert settings.workers == 2
    assert settings.intake_batch_size == settings.scheduler_batch_size == 2000
    assert settings.intake_kafka == kafka_raw.CONSUMER_TUNING
    assert settings.scheduler_kafka == {"linger.ms": service.RELAY_LINGER_MS}
