"""The Prometheus alert rules and the Grafana dashboard in deploy/, without Prometheus:
both files parse and have the shape their loaders expect, and every metric their
PromQL names is one the retry service or a consumer App really exposes (read from
registries built as the code builds them), with label matchers on labels it has."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.share.metrics import ShareMetrics
from redrive.reasons import DeadLetterReason
from redrive.service.metrics import ServiceMetrics
from redrive.service.store import GroupSurge
from redrive.spark.metrics import OUTCOMES as SPARK_RECORD_OUTCOMES
from redrive.spark.metrics import SparkMetrics

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "redrive-alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "redrive-dashboard.json"

# Series Prometheus itself makes for each scrape target (the rules' "is it up" alerts).
SCRAPE_SERIES = {"up": frozenset({"job", "instance"})}
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = frozenset({"job", "instance"})

# Aggregations and functions an expression here may call; any other is refused.
FUNCTIONS = frozenset(
    """
    sum min max avg count stddev stdvar topk bottomk quantile count_values group
    rate irate increase delta idelta deriv histogram_quantile predict_linear
    abs ceil floor round clamp clamp_min clamp_max vector scalar time timestamp
    absent absent_over_time changes resets sort sort_desc label_replace label_join
    avg_over_time min_over_time max_over_time sum_over_time count_over_time
    last_over_time quantile_over_time
    """.split()  # noqa: SIM905
)
KEYWORDS = frozenset(
    "and or unless by without on ignoring group_left group_right offset bool inf nan".split()  # noqa: SIM905
)

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_GRAFANA_VAR = re.compile(r"\$(?:\{[^}]*\}|\w+)")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_TOKEN = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\{[^}]*\})?(\s*\()?")
_MATCHER_LABEL = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*([^,)]+)")
_VALUE_MATCHER = re.compile(r'\b(outcome|reason)\s*(?:=~|!~|!=|=)\s*"([^"]*)"')

# The values the code gives the labels matched on by value: a typo matches nothing.
OUTCOMES = frozenset(
    {
        "handled",
        "retried",
        "dead_lettered",
        "repeat_skipped",
        "refused",
        "untrusted_headers",
        "bookkeeping_ignored",
        "held_behind",
        "held_again",
        "moved_behind",
    }
)
SPARK_OUTCOMES = frozenset({"read", *SPARK_RECORD_OUTCOMES})
LABEL_VALUES = {"outcome": OUTCOMES | SPARK_OUTCOMES, "reason": frozenset(DeadLetterReason)}


def selectors(expr: str) -> Iterator[tuple[str, frozenset[str]]]:
    """Each metric an expression selects, with the label names its matchers name."""
    text = _GRAFANA_VAR.sub("1", _STRING.sub('""', expr))
    text = _GROUPING.sub(" ", _RANGE.sub(" ", text))
    for match in _TOKEN.finditer(text):
        name, braces, call = match.groups()
        if call is not None and braces is None:
            assert name in FUNCTIONS, f"unknown PromQL function {name!r} in {expr!r}"
            continue
        if name in KEYWORDS:
            continue
        labels = frozenset(_MATCHER_LABEL.findall(braces or ""))
        yield name, labels


def registries() -> list[CollectorRegistry]:
    """The service's, an App's and a Spark session's registries, built as the code
    builds them, with one
    child of each labelled metric so that its series and labels show."""
    surge = GroupSurge(error_group="0123456789abcdef", muted=False, last_hour=60, usual_per_hour=2)
    service = ServiceMetrics(
        lambda: {"orders": 3},
        lambda: 0,
        lambda: {"store": True},
        error_group_surges=lambda limit: [surge],
    )
    service.invalid.labels(reason="invalid_request").inc()
    service.published.labels(destination="orders").inc()
    service.dead_lettered.labels(reason="sent_to_dlq").inc()
    service.store_errors.labels(operation="insert").inc()
    service.delivery_errors.labels(error="timeout").inc()
    service.ingested.labels(format="spring").inc()
    service.ingested_again.labels(format="spring").inc()
    service.repeats.labels(stage="retry").inc()
    consumer = ShareMetrics()  # an App's metrics, and a ShareApp's besides
    consumer.records.labels(topic="orders", outcome="handled").inc()
    consumer.breaker_state.labels(topic="orders").set(1)
    consumer.dead_letter_brake_state.labels(topic="orders").set(1)
    consumer.dead_letter_brake_openings.labels(topic="orders").inc()
    consumer.acknowledgements.labels(topic="orders", type="accept").inc()
    consumer.lock_released.labels(topic="orders").inc()
    consumer.lock_outlived.labels(topic="orders").inc()
    spark = SparkMetrics()
    spark.record(
        {
            "name": "redrive-scheduler",
            "numInputRows": 1,
            "durationMs": {"triggerExecution": 500},
            "observedMetrics": {
                "redrive": {
                    "delivered": 1,
                    "dead_lettered": 0,
                    "lateness_ms_sum": 40,
                    "lateness_ms_max": 40,
                }
            },
        }
    )
    spark.stopped("redrive-scheduler", failed=True)
    return [service.registry, consumer.registry, spark.registry]


def exposed() -> dict[str, frozenset[str] | None]:
    """Every series name exposed, with its label names (None: not known, a labelled
    family that has no child yet)."""
    series: dict[str, frozenset[str] | None] = dict(SCRAPE_SERIES)
    for registry in registries():
        for family in registry.collect():
            for sample in family.samples:
                known = series.get(sample.name) or frozenset()
                series[sample.name] = known | set(sample.labels) | TARGET_LABELS
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
            for suffix in suffixes.get(family.type, [""]):
                series.setdefault(family.name + suffix, None)
    return series


def families() -> dict[str, set[str]]:
    """Each metric family's name, with the names of its series."""
    found: dict[str, set[str]] = {}
    for registry in registries():
        for family in registry.collect():
            found[family.name] = {s.name for s in family.samples if not s.name.endswith("_created")}
    return found


def rules() -> list[dict[str, Any]]:
    loaded = yaml.safe_load(RULES.read_text())
    return [rule for group in loaded["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def expressions() -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every rule, panel target and query variable."""
    for rule in rules():
        yield f"alert {rule['alert']}", rule["expr"]
    board = dashboard()
    for panel in panels(board):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r}", target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            query = query["query"] if isinstance(query, dict) else query
            found = _LABEL_VALUES.match(query)
            assert found, f"variable {variable['name']}: only label_values(metric, label)"
            yield f"variable {variable['name']}", found.group(1)


def test_every_rule_has_what_prometheus_and_alertmanager_need() -> None:
    loaded = yaml.safe_load(RULES.read_text())
    assert loaded["groups"], "no rule groups"
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names)), "an alert name is used twice"
    for rule in rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["expr"].strip(), rule["alert"]
        assert re.fullmatch(r"\d+[smh]", str(rule["for"])), rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert rule["annotations"]["description"].strip(), rule["alert"]
    for name in ("RedriveDeadLetters", "RedriveServiceDown", "RedriveConsumerBreakerOpen"):
        assert name in names


def test_the_dashboard_is_an_importable_grafana_dashboard() -> None:
    board = dashboard()
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    datasources = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert [v["query"] for v in datasources] == ["prometheus"]
    every = list(panels(board))
    ids = [panel["id"] for panel in every]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in every:
        assert panel["type"] in {"row", "stat", "timeseries"}, panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]


def test_every_metric_named_is_exposed_with_the_labels_matched_on() -> None:
    series = exposed()
    named = 0
    for where, expr in expressions():
        for name, labels in selectors(expr):
            named += 1
            assert name in series, f"{where}: {name!r} is not a metric redrive exposes"
            known = series[name]
            if known is not None:
                unknown = labels - known
                assert not unknown, f"{where}: {name} has no label {sorted(unknown)}"
    assert named > 20


def test_label_values_matched_on_are_values_the_code_sets() -> None:
    for where, expr in expressions():
        for label, pattern in _VALUE_MATCHER.findall(expr):
            for value in pattern.split("|"):
                assert value in LABEL_VALUES[label], f"{where}: no {label} is {value!r}"


def test_the_outcomes_are_those_the_metric_describes() -> None:
    families = {f.name: f for f in ConsumerMetrics().registry.collect()}
    described = families["redrive_consumer_records"].documentation
    for outcome in OUTCOMES:
        assert outcome in described
    spark = {f.name: f for f in SparkMetrics().registry.collect()}
    for outcome in SPARK_OUTCOMES:
        assert outcome in spark["redrive_spark_records"].documentation


def test_every_labelled_metric_is_touched_above() -> None:
    """A family without samples would have its series named but its labels unchecked."""
    for name, names in families().items():
        assert names, f"{name}: give it a child in registries()"


def test_the_metric_reference_names_every_metric_and_no_other() -> None:
    text = (ROOT / "docs" / "monitoring.md").read_text()
    documented = set(re.findall(r"`(redrive_\w+)", text))
    found = families()
    known = set(found) | {series for names in found.values() for series in names}
    assert documented <= known, f"not exposed: {sorted(documented - known)}"
    for name, names in found.items():
        assert documented & ({name} | names), f"docs/monitoring.md does not name {name}"


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (
            'sum by (job, le) (rate(a_bucket{x="}", y=~"$v"}[$__rate_interval]))',
            [("a_bucket", {"x", "y"})],
        ),
        (
            "histogram_quantile(0.99, b) > 5e3 and on (job) c offset 5m",
            [("b", set()), ("c", set())],
        ),
        ("max by (topic) (d == bool 1) or vector(0)", [("d", set())]),
        ("sum(e) without (instance) / ignoring(x) group_left (y) f", [("e", set()), ("f", set())]),
    ],
)
def test_selectors_are_read_from_promql(expr: str, expected: list[tuple[str, set[str]]]) -> None:
    assert [(name, set(labels)) for name, labels in selectors(expr)] == expected


def test_an_unknown_function_is_refused() -> None:
    with pytest.raises(AssertionError, match="unknown PromQL function"):
        list(selectors("rated(x[5m])"))
