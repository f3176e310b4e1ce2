"""A group's last 24 hours as a small SVG bar chart (a sparkline), drawn by the
templates without script: one bar per hour, the tallest hour full height."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def sparkline(counts: Sequence[int], width: int = 120, height: int = 24) -> dict[str, Any]:
    """Geometry of bars for `counts` (oldest first), each bar titled with its count."""
    n = max(len(counts), 1)
    peak = max([*counts, 1])
    slot = width / n
    bars = []
    for i, count in enumerate(counts):
        h = round(count / peak * (height - 1), 2) if count else 0
        ago = len(counts) - i
        bars.append(
            {
                "x": round(i * slot + slot * 0.1, 2),
                "w": round(slot * 0.8, 2),
                "y": round(height - h, 2),
                "h": h,
                "label": f"{count:,} in the hour {ago} to {ago - 1} hours ago",
            }
        )
    return {"width": width, "height": height, "bars": bars, "total": sum(counts)}
