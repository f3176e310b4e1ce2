"""The benchmarks still run: `python -m bench --quick` at tiny sizes, on the session's
broker and PostgreSQL server (each benchmark makes topics and databases of its own).

This measures nothing (no timing is asserted anywhere in the test suite); it keeps the
benchmark code from rotting between the runs that record figures in
docs/benchmarks.md. The Spark benchmark runs apart from the others, so that the two
halves go to two test workers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SPARK = "spark"
OTHERS = ["service", "precision", "pending", "consumer", "replay", "groups"]


def run_quick(
    only: list[str], tmp_path: Path, bootstrap: str, database_url: str
) -> dict[str, dict[str, Any]]:
    """`python -m bench --quick ONLY...` on the given servers: its results by name."""
    out = tmp_path / "results.json"
    servers = ["--bootstrap", bootstrap, "--database-url", database_url]
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", *only, *servers, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # The table is printed ratio first, then the figures; the limit is in every run.
    assert "1.00x (the limit)" in run.stdout
    return {r["name"]: r for r in json.loads(out.read_text())}


def test_every_benchmark_but_spark_runs_and_reports_its_figures(
    tmp_path: Path, bootstrap: str, database_url: str
) -> None:
    results = run_quick(OTHERS, tmp_path, bootstrap, database_url)
    expected = [
        "1 raw Kafka passthrough",
        "2 ceiling: Kafka relay",
        "2 ceiling: relay through PostgreSQL",
        "2 ceiling: idempotent relay through PostgreSQL",
        "2 service e2e, 1 worker",
        "2 service e2e, 2 workers",
        "2 service e2e, 3 workers",
        "2 service e2e, 1 worker, signed",
        "2 service e2e, 2 workers, signed",
        "3 scheduling precision",
        "4 5,000 pending",
        "4 e2e, 5,000 pending",
        *(
            f"5 consumer {s}"
            for s in ("blocking", "pause", "topics", "service", "service, signed", "async", "batch")
        ),
        "5 consumer service, signed vs unsigned",
        "5 consumer service fail 10%, signed",
        "5 consumer service fail 10%, signed vs unsigned",
        "5 consumer txn",
        "5 consumer fail 10%",
        "5 consumer fail 10%, txn",
        "5 consumer service fail 10%",
        "5 consumer service fail 10%, key order",
        "5 consumer service fail 10%, per-group topic",
        "5 consumer service fail 10%, source topic, key order",
        "5 consumer tiers fail 10%, key order vs unordered",
        "5 consumer service fail 10%, key order vs unordered",
        "5 consumer service, per-group topic fail 10%, key order vs unordered",
        "5 consumer service, source topic fail 10%, key order vs unordered",
        "5 consumer tiers fail 10%, txn",
        "5 consumer tiers fail 10%, txn, key order",
        "5 consumer share group",
        "5 consumer share group, 2 consumers",
        "5 consumer share group, 4 consumers",
        "7 replay job",
        "8 error groups migration, 5,000 letters",
        "8 error groups list, 5,000 letters",
    ]
    assert sorted(results) == sorted(expected)
    # Every message came back (the benchmarks raise otherwise) and was counted.
    assert results["2 service e2e, 1 worker"]["figures"]["n"] == 1_000
    assert results["2 service e2e, 1 worker"]["figures"]["per_s"] > 0
    assert results["2 ceiling: relay through PostgreSQL"]["figures"]["n"] == 1_000
    signed = results["2 service e2e, 1 worker, signed"]["figures"]
    assert 0 < signed["floor_us"] < signed["check_us"] and 0 < signed["ceiling"] < 1
    precision = results["3 scheduling precision"]["figures"]
    assert precision["n"] == 300
    assert precision["early"] == 0, "a retry was delivered before it was due"
    assert results["4 5,000 pending"]["figures"]["early"] == 0
    shared = results["5 consumer share group"]["figures"]
    assert shared["n"] == 1_000 and shared["per_s"] > 0 and shared["bare_per_s"] > 0
    replay = results["7 replay job"]["figures"]
    assert replay["n"] == 1_000 and replay["progress_steps_seen"] > 1
    grouped = results["8 error groups migration, 5,000 letters"]["figures"]
    assert grouped["n"] == 5_000 and grouped["groups"] == 400


@pytest.mark.spark
def test_the_spark_benchmark_runs_and_reports_its_figures(
    tmp_path: Path, bootstrap: str, database_url: str
) -> None:
    results = run_quick([SPARK], tmp_path, bootstrap, database_url)
    assert sorted(results) == sorted(
        [
            "1 raw Kafka passthrough",
            "6 spark pipeline",
            "6 spark exactly-once output",
            "6 spark latency, 1 record",
            "6 spark scheduler",
            "6 spark scheduler exactly-once",
            "6 spark scheduler lateness",
        ]
    )
    assert results["6 spark pipeline"]["figures"]["n"] == 500
    assert results["6 spark exactly-once output"]["figures"]["n"] == 500
    assert results["6 spark scheduler"]["figures"]["n"] == 500
    assert results["6 spark scheduler exactly-once"]["figures"]["n"] == 500
    lateness = results["6 spark scheduler lateness"]["figures"]  # exactly once, the default
    assert lateness["n"] == 1_000  # 500/s for 2 s
    assert lateness["early"] == 0, "the Spark scheduler delivered a retry before it was due"
    assert results["6 spark latency, 1 record"]["figures"]["samples"] == 5
