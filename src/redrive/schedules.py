"""Schedules: the delay before each retry, as a list of steps or an exponential backoff.

A schedule answers the only question a :class:`redrive.policy.Policy` leaves to it:
after failed attempt n, how long until retry n, or is the schedule spent? Limits,
deadlines and error classification are the policy's. Every schedule has a string form
that :func:`parse_schedule` reads back to an equal schedule, so a schedule can live in a
config file, an environment variable or a command line and be printed as it was meant.

:func:`backoff_delay` is the one exponential backoff formula: the policy's
:class:`ExponentialBackoff` uses it, and so does anything else in redrive that backs off
(the retry service between attempts to reach its store, importing it from here).
Users import the schedules, with the rest of a policy, from :mod:`redrive.policy`.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Final, TypeAlias

from redrive.durations import (
    MAX_DELAY_MS,
    PolicyError,
    format_duration,
    parse_duration_at,
    seconds_to_ms,
    spec_error,
    to_ms,
)


def backoff_delay(attempt: int, initial: float, cap: float, multiplier: float = 2.0) -> float:
    """``initial * multiplier ** (attempt - 1)``, at most ``cap``: exponential backoff.

    The wait before try ``attempt + 1`` after ``attempt`` failures in a row (1-based),
    in the unit ``initial`` and ``cap`` share (ms for :class:`ExponentialBackoff`,
    seconds for the retry service's store). ``initial`` and ``multiplier`` must be > 0.
    Past the cap the answer is ``cap`` itself, found in log space, so a huge attempt
    neither overflows nor takes long.
    """
    if not (initial > 0 and multiplier > 0):
        raise ValueError(f"backoff needs initial > 0 and multiplier > 0: {initial}, {multiplier}")
    growth = attempt - 1
    if multiplier == 1 or growth == 0:
        return min(cap, initial)
    if cap <= 0 or growth * math.log(multiplier) >= math.log(cap / initial):
        return cap  # checked in log space: the power itself could overflow
    return min(cap, initial * multiplier**growth)


def format_number(value: float) -> str:
    """Exact, short text for a float (``2.0`` -> ``"2"``) so specs round-trip."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


Run: TypeAlias = tuple[int, int | None]
"""(delay in ms, how many retries in a row use it; None: forever)."""


@dataclass(frozen=True, slots=True)
class Step:
    """``count`` retries in a row, each after ``delay_ms``; ``count=None`` is forever."""

    delay_ms: int
    count: int | None = 1


@dataclass(frozen=True, slots=True)
class DelaySchedule:
    """An explicit list of delays, like ``"5m x2, 30m x3, 1h"`` (5m, 5m, 30m, 30m, 30m, 1h).

    Retry number n (after failed attempt n) waits the n-th delay; when the list is spent
    the message is dead-lettered. A last step repeated forever (``"1m x*"``) needs a
    ``max_attempts`` or ``max_duration`` on the policy. Adjacent equal steps are merged,
    so equal schedules compare equal whatever way they were written.
    """

    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        if not self.steps:
            raise PolicyError(
                "empty schedule: give at least one delay (for no retries use max_attempts=1)"
            )
        merged: list[Step] = []
        for index, step in enumerate(self.steps):
            if type(step.delay_ms) is not int or not 0 <= step.delay_ms <= MAX_DELAY_MS:
                raise PolicyError(f"step {index + 1}: delay {step.delay_ms} ms out of range")
            if step.count is None and index != len(self.steps) - 1:
                raise PolicyError(f"step {index + 1}: only the last step may repeat forever")
            if step.count is not None and step.count < 1:
                raise PolicyError(f"step {index + 1}: repeat count must be >= 1")
            previous = merged[-1] if merged else None
            if previous is not None and previous.count and previous.delay_ms == step.delay_ms:
                total = None if step.count is None else previous.count + step.count
                merged[-1] = Step(step.delay_ms, total)
            else:
                merged.append(step)
        object.__setattr__(self, "steps", tuple(merged))

    @classmethod
    def of(cls, *delays_ms: int) -> DelaySchedule:
        """A schedule of the given delays, in milliseconds."""
        return cls(tuple(Step(d) for d in delays_ms))

    @property
    def retries(self) -> int | None:
        """How many retries the schedule offers (None: unbounded)."""
        if self.steps[-1].count is None:
            return None
        return sum(step.count or 0 for step in self.steps)

    def runs(self) -> Iterator[Run]:
        for step in self.steps:
            yield step.delay_ms, step.count

    def delay_ms(self, attempt: int, rng: random.Random | None = None) -> int | None:
        """Delay after failed attempt ``attempt`` (1-based), None when spent."""
        remaining = attempt
        for step in self.steps:
            if step.count is None or remaining <= step.count:
                return step.delay_ms
            remaining -= step.count
        return None

    def __str__(self) -> str:
        def item(step: Step) -> str:
            text = format_duration(step.delay_ms)
            if step.count is None:
                return f"{text} x*"
            return text if step.count == 1 else f"{text} x{step.count}"

        return ", ".join(item(step) for step in self.steps)


@dataclass(frozen=True, slots=True)
class ExponentialBackoff:
    """Delays ``initial_ms * multiplier ** (n - 1)`` for retry n, capped at ``max_delay_ms``.

    ``jitter`` j in 0..1 draws each delay uniformly from ``[(1 - j) * d, d]`` where d is
    the capped delay: jitter only ever shortens a delay, so the cap and the deadline
    still hold (j = 1 is "full jitter", j = 0.5 "equal jitter"). ``retries`` limits the
    number of retries (None: unbounded, then the policy needs another limit).
    String form: ``exponential <initial> [x<multiplier>] [max <cap>] [jitter <j>]
    [retries <n>]``.
    """

    initial_ms: int
    multiplier: float = 2.0
    max_delay_ms: int | None = None
    jitter: float = 0.0
    retries: int | None = None

    def __post_init__(self) -> None:
        if type(self.initial_ms) is not int or not 0 < self.initial_ms <= MAX_DELAY_MS:
            raise PolicyError(f"exponential: initial delay must be > 0, got {self.initial_ms} ms")
        # Below 1.01 delays would creep up over millions of attempts: a mistake, and
        # too slow to explain. 1 is fine (a constant delay).
        if not (
            math.isfinite(self.multiplier) and (self.multiplier == 1 or self.multiplier >= 1.01)
        ):
            raise PolicyError(
                f"exponential: multiplier must be 1 or at least 1.01, got {self.multiplier!r}"
            )
        if self.max_delay_ms is not None and not (
            type(self.max_delay_ms) is int and self.initial_ms <= self.max_delay_ms <= MAX_DELAY_MS
        ):
            raise PolicyError(
                f"exponential: max delay {format_duration(self.max_delay_ms)} must be at "
                f"least the initial delay {format_duration(self.initial_ms)}"
            )
        if not (math.isfinite(self.jitter) and 0 <= self.jitter <= 1):
            raise PolicyError(f"exponential: jitter must be between 0 and 1, got {self.jitter!r}")
        if self.retries is not None and (type(self.retries) is not int or self.retries < 1):
            raise PolicyError(f"exponential: retries must be >= 1, got {self.retries!r}")

    @property
    def cap_ms(self) -> int:
        return MAX_DELAY_MS if self.max_delay_ms is None else self.max_delay_ms

    def nominal_ms(self, attempt: int) -> int:
        """The delay after failed attempt ``attempt`` before jitter (the largest it can be)."""
        return round(backoff_delay(attempt, self.initial_ms, self.cap_ms, self.multiplier))

    def delay_ms(self, attempt: int, rng: random.Random | None = None) -> int | None:
        """Delay after failed attempt ``attempt``; jittered when ``rng`` is given."""
        if self.retries is not None and attempt > self.retries:
            return None
        nominal = self.nominal_ms(attempt)
        if rng is None or self.jitter == 0:
            return nominal
        return nominal - int(nominal * self.jitter * rng.random())

    def runs(self) -> Iterator[Run]:
        attempt = 1
        while self.retries is None or attempt <= self.retries:
            delay = self.nominal_ms(attempt)
            left = None if self.retries is None else self.retries - attempt + 1
            if delay >= self.cap_ms or self.multiplier == 1:
                yield delay, left  # constant from here on
                return
            count = 1
            while (left is None or count < left) and self.nominal_ms(attempt + count) == delay:
                count += 1
            yield delay, count
            attempt += count

    def __str__(self) -> str:
        parts = [f"exponential {format_duration(self.initial_ms)}"]
        parts.append(f"x{format_number(self.multiplier)}")
        if self.max_delay_ms is not None:
            parts.append(f"max {format_duration(self.max_delay_ms)}")
        if self.jitter:
            parts.append(f"jitter {format_number(self.jitter)}")
        if self.retries is not None:
            parts.append(f"retries {self.retries}")
        return " ".join(parts)


Schedule: TypeAlias = DelaySchedule | ExponentialBackoff

_EXPECTED_SCHEDULE: Final = (
    'expected delays like "5m x2, 30m x3, 1h": a duration, optionally x<count>; '
    "x* on the last one repeats it forever"
)
_EXPECTED_EXPONENTIAL: Final = (
    'expected "exponential <initial> [x<multiplier>] [max <duration>] [jitter <0..1>] '
    '[retries <n>]", like "exponential 1s x2 max 5m jitter 0.2 retries 8"'
)


def _parse_steps(spec: str, context: str) -> DelaySchedule:
    """Parse ``"5m x2, 30m x3, 1h"``; errors give the 0-based position of the token."""
    steps: list[Step] = []
    items = spec.split(",")
    item_start = 0
    for index, item in enumerate(items):
        start, item_start = item_start, item_start + len(item) + 1
        if not item.strip():
            raise spec_error(context, "empty item", start, _EXPECTED_SCHEDULE)
        x_at = item.lower().find("x")
        if x_at < 0:
            steps.append(Step(parse_duration_at(item, context, start)))
            continue
        delay = parse_duration_at(item[:x_at], context, start)
        token = item[x_at + 1 :].strip()
        if token == "*":  # noqa: S105  # not a password: "x*" repeats forever
            if index != len(items) - 1:
                problem = "'x*' (repeat forever) is only allowed on the last item"
                raise spec_error(context, problem, start + x_at, _EXPECTED_SCHEDULE)
            steps.append(Step(delay, None))
        elif token.isascii() and token.isdigit() and int(token) >= 1:
            steps.append(Step(delay, int(token)))
        else:
            problem = f"bad repeat count {'x' + token!r}"
            raise spec_error(context, problem, start + x_at, _EXPECTED_SCHEDULE)
    return DelaySchedule(tuple(steps))


def _parse_number(token: str, context: str, position: int, what: str) -> float:
    try:
        value = float(token)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or token.strip() != token:
        raise spec_error(
            context, f"{what} {token!r} is not a number", position, _EXPECTED_EXPONENTIAL
        )
    return value


def _parse_exponential(spec: str, context: str) -> ExponentialBackoff:
    """Parse ``"exponential 1s x2 max 5m jitter 0.2 retries 8"`` (commas optional)."""
    tokens = [(m.group(), m.start()) for m in re.finditer(r"[^\s,]+", spec)]
    if len(tokens) < 2:
        raise spec_error(context, "missing initial delay", len(spec), _EXPECTED_EXPONENTIAL)
    initial = parse_duration_at(tokens[1][0], context, tokens[1][1])
    options: dict[str, float | int] = {}
    queue = tokens[2:]
    while queue:
        word, position = queue.pop(0)
        key = word.lower()
        if key.startswith("x"):
            key, word = "x", word[1:]
        elif key in ("max", "jitter", "retries"):
            word = ""
        else:
            problem = f"unknown option {word!r}"
            raise spec_error(context, problem, position, _EXPECTED_EXPONENTIAL)
        if key in options:
            raise spec_error(context, f"{key!r} given twice", position, _EXPECTED_EXPONENTIAL)
        if not word:  # the value is the next token: "max 5m", "x 2"
            if not queue:
                problem = f"missing value after {key!r}"
                raise spec_error(context, problem, len(spec), _EXPECTED_EXPONENTIAL)
            word, position = queue.pop(0)
        if key == "max":
            options[key] = parse_duration_at(word, context, position)
        elif key == "retries":
            if not (word.isascii() and word.isdigit()):
                problem = f"retries {word!r} is not a whole number"
                raise spec_error(context, problem, position, _EXPECTED_EXPONENTIAL)
            options[key] = int(word)
        else:
            options[key] = _parse_number(word, context, position, key)
    try:
        return ExponentialBackoff(
            initial,
            multiplier=float(options.get("x", 2.0)),
            max_delay_ms=int(options["max"]) if "max" in options else None,
            jitter=float(options.get("jitter", 0.0)),
            retries=int(options["retries"]) if "retries" in options else None,
        )
    except PolicyError as error:
        raise PolicyError(f"{context}: {error}; {_EXPECTED_EXPONENTIAL}") from None


def _parse_json_list(spec: str, context: str) -> DelaySchedule:
    try:
        value = json.loads(spec)
    except json.JSONDecodeError as error:
        problem = f"not valid JSON ({error.msg})"
        expected = "expected a JSON list of seconds like [10, 60, 300]"
        raise spec_error(context, problem, error.pos, expected) from None
    if not isinstance(value, list):
        raise PolicyError(f"{context}: expected a JSON list of seconds like [10, 60, 300]")
    return _from_sequence(value, context)


def _from_sequence(items: Sequence[object], context: str) -> DelaySchedule:
    """Delays from a list: numbers are seconds, strings durations, or timedeltas."""
    delays: list[int] = []
    for index, item in enumerate(items):
        where = f"{context}: item {index + 1}"
        if isinstance(item, str):
            delays.append(parse_duration_at(item, where))
        elif isinstance(item, timedelta):
            delays.append(to_ms(item, where))
        else:
            delays.append(seconds_to_ms(item, where))
    if not delays:
        raise PolicyError(
            f"{context}: empty list; give at least one delay (for no retries use max_attempts=1)"
        )
    return DelaySchedule.of(*delays)


ScheduleSpec: TypeAlias = Schedule | str | Sequence[float | str | timedelta]
"""Anything :func:`parse_schedule` accepts."""


def parse_schedule(spec: ScheduleSpec) -> Schedule:
    """A schedule from any of its forms.

    - ``"5m x2, 30m x3, 1h"``: delays with repeat counts, ``x*`` repeats the last forever;
    - ``"[10, 60, 300]"``: a JSON list of seconds;
    - ``"exponential 1s x2 max 5m jitter 0.2 retries 8"``: exponential backoff;
    - a list of seconds (numbers), duration strings or timedeltas;
    - a schedule object, returned as it is.

    ``parse_schedule(str(s)) == s`` for every schedule.
    """
    if isinstance(spec, DelaySchedule | ExponentialBackoff):
        return spec
    if isinstance(spec, str):
        context = f"schedule {spec!r}"
        text = spec.strip()
        if not text:
            raise PolicyError(f"{context}: empty; {_EXPECTED_SCHEDULE}")
        if text[0] in "[{":
            return _parse_json_list(spec, context)
        if text.split()[0].lower() == "exponential":
            return _parse_exponential(spec, context)
        return _parse_steps(spec, context)
    if isinstance(spec, Sequence):
        return _from_sequence(spec, f"schedule {list(spec)!r}")
    raise PolicyError(
        f"schedule: cannot use a {type(spec).__name__}; expected a string like "
        '"5m x2, 30m x3, 1h", a JSON list of seconds, or a list of numbers'
    )
