"""Values as the web pages show them: times (absolute and relative, any int64 of
epoch milliseconds), numbers, control characters, and payloads (JSON indented, text
as is, anything else as a hex dump)."""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any


def _span(seconds: float) -> str:
    s = int(abs(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 10:
        return f"{m}m {s}s" if s else f"{m}m"
    if m < 60:
        return f"{m}m"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h {m}m" if m else f"{h}h"
    d, h = divmod(h, 24)
    return f"{d}d {h}h" if h else f"{d}d"


def relative(when: datetime, now: datetime) -> str:
    """'in 12s', '3m 5s ago', 'now'."""
    delta = (when - now).total_seconds()
    if abs(delta) < 1:
        return "now"
    return f"in {_span(delta)}" if delta > 0 else f"{_span(delta)} ago"


@dataclass(frozen=True, slots=True)
class When:
    iso: str | None  # None: beyond the calendar (no <time> element)
    absolute: str
    rel: str


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _beyond_calendar(ms: int) -> When:
    """A time in epoch ms that datetime cannot hold (a producer may set any int64)."""
    side = "after the year 9999" if ms > 0 else "before the year 1"
    return When(iso=None, absolute=f"{ms:,} ms since 1970 ({side})", rel=side)


def when(value: datetime | str | int | None) -> When | None:
    """A time for display: datetime, ISO text or epoch milliseconds (any int64)."""
    if value is None or value == "":
        return None
    if isinstance(value, int):
        try:
            # Integer arithmetic: exact, and OverflowError (not a wrong date) outside
            # the years 1 to 9999.
            at = EPOCH + timedelta(milliseconds=value)
        except OverflowError:
            return _beyond_calendar(value)
    elif isinstance(value, str):
        at = datetime.fromisoformat(value)
    else:
        at = value
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    # An offset that would move it past the year 1 or 9999: shown in its own offset.
    with contextlib.suppress(OverflowError):
        at = at.astimezone(UTC)
    return When(
        iso=at.isoformat(timespec="milliseconds"),
        # %Y does not pad years before 1000 on every platform.
        absolute=f"{at.year:04d}" + at.strftime("-%m-%d %H:%M:%S %Z"),
        rel=relative(at, datetime.now(UTC)),
    )


def number(value: int | float) -> str:
    return f"{value:,}"


def hexdump(raw: bytes) -> str:
    lines = []
    for offset in range(0, len(raw), 16):
        chunk = raw[offset : offset + 16]
        hexes = (
            " ".join(f"{b:02x}" for b in chunk[:8]) + "  " + " ".join(f"{b:02x}" for b in chunk[8:])
        )
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:08x}  {hexes:<49} {text}")
    return "\n".join(lines)


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def visible(text: str | None) -> str:
    """Text with its control characters written as escapes (\\x00), for table cells."""
    if text is None:
        return ""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def payload_view(rendered: dict[str, Any] | None) -> dict[str, Any]:
    """How to show a key or value rendered by the API's render_bytes."""
    if rendered is None:
        return {"kind": "null", "size": 0, "body": "", "text": None, "raw": None}
    text = rendered["text"]
    parsed = rendered["json"]
    view: dict[str, Any] = {"size": rendered["size"], "text": text, "raw": text}
    if isinstance(parsed, dict | list):
        view |= {"kind": "json", "body": json.dumps(parsed, indent=2, ensure_ascii=False)}
    elif text is not None and not _CONTROL.search(text):
        view |= {"kind": "text", "body": text}
    else:
        view |= {"kind": "binary", "body": hexdump(bytes.fromhex(rendered["hex"]))}
    view["truncated"] = view["kind"] == "binary" and rendered["hex_truncated"]
    return view
