"""The error groups' surge gauges, read from the store when Prometheus scrapes.

Per error group active in the last hour (at most :data:`MAX_GROUPS` of them, those
with the most letters: the label's cardinality is bounded whatever the failures),
labelled with the group's fingerprint (``error_group``) and whether it is muted:

- ``redrive_error_group_letters_last_hour``: its dead letters stored in the last hour;
- ``redrive_error_group_usual_per_hour``: its hourly average over the 24 hours before;
- ``redrive_error_group_surge_ratio``: the first over the second (the usual taken as
  at least 1 an hour, so that a new group's ratio is its count).

They count the letters in the store: letters replayed or deleted since are not
counted, nor are letters that came back dead from a replay (an earlier failure seen
again: a replay of a group does not make it look like a surge). Read at most every
``ttl_s`` seconds; while the store is unreachable the last figures are served.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Final

import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from redrive.service.store import GroupSurge

log = structlog.get_logger("redrive.metrics")

MAX_GROUPS: Final = 50
# A surge, as the alert rule RedriveErrorGroupSurge has it (deploy/prometheus): this
# many times its usual hourly count, and at least this many letters in the hour. The
# overview page shows the groups that are surging by the same rule.
SURGE_RATIO: Final = 10
SURGE_MIN_LETTERS: Final = 50


def surging(surge: GroupSurge) -> bool:
    """Whether the group is surging, as the alert rule says (muted groups never)."""
    return not surge.muted and surge.ratio > SURGE_RATIO and surge.last_hour >= SURGE_MIN_LETTERS


class ErrorGroupCollector(Collector):
    def __init__(self, read: Callable[[int], list[GroupSurge]], ttl_s: float = 60.0) -> None:
        self._read = read
        self._ttl_s = ttl_s
        self._cached: list[GroupSurge] = []
        self._read_at = -float("inf")

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["error_group", "muted"]
        recent = GaugeMetricFamily(
            "redrive_error_group_letters_last_hour",
            "Dead letters of the error group stored in the last hour (groups active in "
            f"the last hour, the {MAX_GROUPS} largest).",
            labels=labels,
        )
        usual = GaugeMetricFamily(
            "redrive_error_group_usual_per_hour",
            "The error group's dead letters an hour, on average over the 24 hours before "
            "the last one.",
            labels=labels,
        )
        ratio = GaugeMetricFamily(
            "redrive_error_group_surge_ratio",
            "The error group's letters of the last hour over its usual hourly count "
            "(at least 1): how far above its usual it is.",
            labels=labels,
        )
        if time.monotonic() - self._read_at > self._ttl_s:
            try:
                self._cached = self._read(MAX_GROUPS)
                self._read_at = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - a scrape must not fail while the store is down
                log.warning(
                    "error group figures unavailable; serving the last ones", error=str(exc)
                )
        for surge in self._cached:
            values = [surge.error_group, "true" if surge.muted else "false"]
            recent.add_metric(values, surge.last_hour)
            usual.add_metric(values, surge.usual_per_hour)
            ratio.add_metric(values, surge.ratio)
        yield recent
        yield usual
        yield ratio
