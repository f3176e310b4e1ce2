"""The overview's charts and tables: geometry of SVG bar charts of per-minute counts,
and by-key count tables with each row's share, drawn by the templates without script."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50... at or above `value`."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= value:
                return step * factor
        step *= 10


def chart(
    series: dict[str, list[dict[str, Any]]],
    bars: str,
    line: str | None = None,
    width: int = 720,
    height: int = 170,
) -> dict[str, Any]:
    """Geometry of an SVG chart of per-minute counts: bars, an optional line."""
    left, right, top, bottom = 44, 8, 10, 24
    points = series[bars]
    n = max(len(points), 1)
    values = [p["count"] for p in points]
    others = [p["count"] for p in series[line]] if line else [0] * len(points)
    peak = _nice_ceiling(max([*values, *others, 1]))
    inner_w, inner_h = width - left - right, height - top - bottom
    slot = inner_w / n
    bar_w = max(slot * 0.72, 1.0)

    def y_of(v: int) -> float:
        return top + inner_h - v / peak * inner_h

    slots = []
    for i, point in enumerate(points):
        minute = datetime.fromisoformat(point["minute"]).astimezone(UTC)
        x = left + i * slot
        label = f"{minute:%H:%M} UTC: {point['count']:,} {bars.replace('_', ' ')}"
        if line:
            label += f", {others[i]:,} {line.replace('_', ' ')}"
        slots.append(
            {
                "x": round(x, 2),
                "w": round(slot, 2),
                "bar_x": round(x + (slot - bar_w) / 2, 2),
                "bar_w": round(bar_w, 2),
                "bar_y": round(y_of(point["count"]), 2),
                "bar_h": round(inner_h - (y_of(point["count"]) - top), 2),
                "label": label,
            }
        )
    polyline = ""
    if line:
        polyline = " ".join(
            f"{left + (i + 0.5) * slot:.2f},{y_of(v):.2f}" for i, v in enumerate(others)
        )
    marks = (0, peak // 2, peak) if peak % 2 == 0 else (0, peak)
    ticks = [{"y": round(y_of(v), 2), "label": f"{v:,}"} for v in marks]
    xlabels = []
    for i in (0, len(points) // 2, len(points) - 1) if points else ():
        minute = datetime.fromisoformat(points[i]["minute"]).astimezone(UTC)
        xlabels.append({"x": round(left + (i + 0.5) * slot, 2), "label": f"{minute:%H:%M}"})
    return {
        "width": width,
        "height": height,
        "left": left,
        "right": width - right,
        "base": top + inner_h,
        "slots": slots,
        "polyline": polyline,
        "ticks": ticks,
        "xlabels": xlabels,
        "total": sum(values),
        "line_total": sum(others),
        "bars": bars,
        "line": line,
    }


def breakdown(rows: list[dict[str, Any]], link: str | None) -> list[dict[str, Any]]:
    """Rows of a by-key count table with each row's share and its filtered-list link."""
    peak = max((r["count"] for r in rows), default=0) or 1
    return [
        {
            "key": r["key"],
            "count": r["count"],
            "share": round(r["count"] / peak * 100, 1),
            "href": f"{link}{quote(str(r['key']), safe='')}" if link and r["key"] else None,
        }
        for r in rows
    ]
