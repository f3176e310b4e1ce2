"""The scheduler's lateness histogram, observed a batch at a time, exposes what
prometheus_client's Histogram would for the same values, one at a time."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from redrive.service.metrics import LATENESS_BUCKETS, LatenessHistogram

NAME = "redrive_retry_lateness_seconds"


def _exposed(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    """Samples as a scrape reads them (through the text format), `_created` aside."""
    text = generate_latest(registry).decode()
    return {
        (s.name, s.labels.get("le", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def _both(batches: list[tuple[int, list[int]]]) -> tuple[dict, dict]:  # type: ignore[type-arg]
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batched = LatenessHistogram(NAME, "d", LATENESS_BUCKETS)
    ours.register(batched)
    single = Histogram(NAME, "d", buckets=LATENESS_BUCKETS, registry=theirs)
    for now, dues in batches:
        batched.observe_batch(now, dues)
        for due in dues:
            single.observe(max(now - due, 0) / 1000)
    return _exposed(ours), _exposed(theirs)


# Due times around each bucket's edge (lateness of bound * 1000 ms, and one ms either
# side), as well as anywhere, and some due after the batch's instant (lateness 0).
_NOW = 1_800_000_000_000
_EDGES = [round(b * 1000) + d for b in LATENESS_BUCKETS for d in (-1, 0, 1)]
_lateness_ms = st.one_of(
    st.sampled_from(_EDGES), st.integers(-5_000, 200_000), st.integers(0, 2**40)
)
_batches = st.lists(
    st.tuples(st.integers(0, 10_000), st.lists(_lateness_ms, max_size=60)), max_size=6
)


@given(_batches)
def test_a_batch_at_a_time_exposes_what_one_value_at_a_time_does(
    batches: list[tuple[int, list[int]]],
) -> None:
    # Each batch: (its instant after _NOW, the lateness in ms of each of its retries).
    given_batches = [
        (_NOW + at, [_NOW + at - late for late in lateness]) for at, lateness in batches
    ]
    ours, theirs = _both(given_batches)
    assert ours.keys() == theirs.keys()
    for sample, value in theirs.items():
        if sample[0].endswith("_sum"):
            # Added up in whole milliseconds, not in floats one value at a time.
            assert ours[sample] == pytest.approx(value, rel=1e-9, abs=1e-9)
        else:
            assert ours[sample] == value, sample


def test_each_bucket_counts_what_is_within_it() -> None:
    now = _NOW
    ours, _ = _both([(now, [now - 1, now - 2, now - 3, now + 50, now - 60_001])])
    assert ours[(f"{NAME}_bucket", "0.001")] == 2  # 1 ms late, and one due after now
    assert ours[(f"{NAME}_bucket", "0.0025")] == 3
    assert ours[(f"{NAME}_bucket", "0.005")] == 4
    assert ours[(f"{NAME}_bucket", "60.0")] == 4
    assert ours[(f"{NAME}_bucket", "+Inf")] == 5
    assert ours[(f"{NAME}_count", "")] == 5
    assert ours[(f"{NAME}_sum", "")] == pytest.approx((1 + 2 + 3 + 60_001) / 1000)
