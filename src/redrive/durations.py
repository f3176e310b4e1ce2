"""Durations as policies write them (``"5m"``, ``"1h30m"``, ``"250ms"``), and the error
every policy spec raises.

Schedules, ``max_duration`` and ``redrive policy explain`` all count time in whole
milliseconds, read from text, from seconds or from a timedelta, and print it back in
the shortest exact form, so that a spec survives a round trip through its text. The
parsers here point at the offending token, so that a bad spec in a config file says
where it is wrong. :class:`PolicyError` lives here, under every parser that raises
it; users import it, with the rest, from :mod:`redrive.policy`.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from decimal import Decimal
from typing import Final


class PolicyError(ValueError):
    """A policy or schedule spec is invalid: says what is wrong and what is expected.

    ``position`` is the 0-based offset of the offending token in a string spec.
    """

    def __init__(self, message: str, *, position: int | None = None) -> None:
        super().__init__(message)
        self.position = position


UNITS: Final[dict[str, int]] = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
"""Duration units and their length in milliseconds."""
MAX_DELAY_MS: Final = 3650 * UNITS["d"]
"""No duration may exceed ten years; also the ceiling of an uncapped exponential."""

_EXPECTED_DURATION: Final = "expected a duration like 5m, 1.5s or 1h30m (units ms, s, m, h, d)"
_DURATION_PART: Final = re.compile(
    r"\s*(?P<num>[0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*(?P<unit>[A-Za-z]*)"
)


def spec_error(context: str, problem: str, position: int | None, expected: str) -> PolicyError:
    """The error for a bad spec: what (``context``), what is wrong, where, what would do."""
    where = f" at position {position}" if position is not None else ""
    return PolicyError(f"{context}: {problem}{where}; {expected}", position=position)


def parse_duration_at(text: str, context: str, offset: int = 0) -> int:
    """Milliseconds in ``text`` (``"1h30m"``); errors point at ``offset + index``.

    For a duration inside a larger spec: ``context`` names the spec in the error and
    ``offset`` is where ``text`` starts in it.
    """
    if not text.strip():
        raise spec_error(context, "missing duration", offset, _EXPECTED_DURATION)
    total, pos = Decimal(0), 0
    while text[pos:].strip():
        match = _DURATION_PART.match(text, pos)
        start = offset + len(text[pos:]) - len(text[pos:].lstrip()) + pos
        if match is None:
            token = text[pos:].split()[0]
            raise spec_error(context, f"unexpected {token!r}", start, _EXPECTED_DURATION)
        number, unit = match["num"], match["unit"]
        if not unit:
            problem = f"missing unit after {number!r}"
            raise spec_error(context, problem, start, _EXPECTED_DURATION)
        if unit not in UNITS:
            problem = f"unknown unit {unit!r} in {number + unit!r}"
            raise spec_error(context, problem, start, _EXPECTED_DURATION)
        total += Decimal(number) * UNITS[unit]
        pos = match.end()
    return _checked_ms(total, context, offset, text.strip())


def _checked_ms(ms: Decimal, context: str, position: int | None, shown: str) -> int:
    if ms < 0:
        raise spec_error(context, f"{shown} is negative", position, _EXPECTED_DURATION)
    if ms != ms.to_integral_value():
        problem = f"{shown} is finer than a millisecond"
        raise spec_error(context, problem, position, _EXPECTED_DURATION)
    if ms > MAX_DELAY_MS:
        limit = format_duration(MAX_DELAY_MS)
        raise spec_error(context, f"{shown} is longer than {limit}", position, _EXPECTED_DURATION)
    return int(ms)


def parse_duration(text: str) -> int:
    """Milliseconds in a duration string: ``"5m"`` -> 300000, ``"1.5s"``, ``"1h30m"``.

    Units ms, s, m, h, d (lower case); decimals and spaces allowed; whole milliseconds.
    """
    return parse_duration_at(text, f"duration {text!r}")


def format_duration(ms: int) -> str:
    """Shortest exact text for a duration, as :func:`parse_duration` reads it.

    ``300000`` -> ``"5m"``, ``5400000`` -> ``"1h30m"``, ``250`` -> ``"250ms"``, 0 -> ``"0s"``.
    """
    if ms < 0:
        raise ValueError(f"negative duration: {ms} ms")
    if ms == 0:
        return "0s"
    parts = []
    for unit in ("d", "h", "m", "s", "ms"):
        count, ms = divmod(ms, UNITS[unit])
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def seconds_to_ms(value: object, context: str, position: int | None = None) -> int:
    """A number of seconds (int or float, not bool) as whole milliseconds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise spec_error(context, f"{value!r} is not a number", position, "expected seconds >= 0")
    if not math.isfinite(value) or value < 0:
        raise spec_error(context, f"{value!r} is not >= 0", position, "expected seconds >= 0")
    return _checked_ms(Decimal(repr(value)) * 1000, context, position, repr(value))


def to_ms(value: str | float | timedelta, what: str = "duration") -> int:
    """A duration given as text (``"1h"``), seconds (``3600``) or a timedelta, in ms."""
    if isinstance(value, timedelta):
        return _checked_ms(Decimal(value // timedelta(milliseconds=1)), what, None, str(value))
    if isinstance(value, str):
        return parse_duration_at(value, f"{what} {value!r}")
    return seconds_to_ms(value, what)
