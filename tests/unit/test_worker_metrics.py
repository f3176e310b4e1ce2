"""Worker 0's /metrics adds up the other workers' counters and histograms."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from redrive.service.workers import merged


def _registry(published: dict[str, int], lateness: list[float], gauge: float) -> CollectorRegistry:
    r = CollectorRegistry()
    counter = Counter("redrive_retries_published", "d", ["destination"], registry=r)
    for destination, count in published.items():
        counter.labels(destination).inc(count)
    histogram = Histogram("redrive_lateness_seconds", "l", buckets=(0.1, 1.0), registry=r)
    for value in lateness:
        histogram.observe(value)
    Gauge("redrive_pending", "p", registry=r).set(gauge)
    return r


def _values(families: list) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:  # type: ignore[type-arg]
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in families
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_counters_and_histograms_add_up_and_gauges_are_worker_0s() -> None:
    own = _registry({"a": 3, "b": 1}, [0.05, 2.0], gauge=7)
    other = _registry({"a": 4, "c": 2}, [0.5], gauge=7)
    others = list(text_string_to_metric_families(generate_latest(other).decode()))
    values = _values(list(merged(own.collect(), others)))
    assert values[("redrive_retries_published_total", (("destination", "a"),))] == 7
    assert values[("redrive_retries_published_total", (("destination", "b"),))] == 1
    assert values[("redrive_retries_published_total", (("destination", "c"),))] == 2
    assert values[("redrive_lateness_seconds_count", ())] == 3
    assert values[("redrive_lateness_seconds_bucket", (("le", "0.1"),))] == 1
    assert values[("redrive_lateness_seconds_bucket", (("le", "1.0"),))] == 2
    assert values[("redrive_lateness_seconds_sum", ())] == pytest.approx(2.55)
    assert values[("redrive_pending", ())] == 7  # the same store: not added twice
    # What it gives is still valid exposition (one family per name).
    text = generate_latest(_Families(list(merged(own.collect(), others)))).decode()
    assert text.count("# TYPE redrive_retries_published_total counter") == 1


class _Families(CollectorRegistry):
    def __init__(self, families: list) -> None:  # type: ignore[type-arg]
        super().__init__()
        self._families = families

    def collect(self):  # type: ignore[no-untyped-def]
        yield from self._families
