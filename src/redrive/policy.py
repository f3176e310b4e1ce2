"""Retry policies: after a failure, retry at what time, or dead-letter for what reason.

A :class:`Policy` answers one question, the same for every strategy (blocking, pause,
retry topics, retry service): given the attempt number (failed attempts so far, 1 after
the first failure), when the failures started and the error, should the message come
back, and when? It is pure: the time and the randomness are passed in, so strategies,
tests and ``redrive policy explain`` all get the same answer.

A policy is made of

- a schedule of delays: a string ``"5m x2, 30m x3, 1h"``, a JSON list of seconds
  ``"[10, 60, 300]"``, a Python list, or exponential backoff
  ``"exponential 1s x2 max 5m jitter 0.2 retries 8"``;
- limits: ``max_attempts`` and ``max_duration`` (measured from the first failure or the
  original record timestamp); a retry is never scheduled after the deadline;
- an error classification: ``retry_on`` / ``fatal_on`` exception types, a ``retryable``
  predicate and the :class:`FatalError` / :class:`RetryableError` markers, looked up
  along the exception's cause chain. Fatal errors skip retries.

Precedence, first match wins: fatal error, then attempts exhausted, then deadline.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from decimal import Decimal
from typing import Any, Final, Literal, TypeAlias, TypedDict, Unpack

from redrive.headers import qualified_name

# Re-exported: a policy's DeadLetter carries one (redrive.policy.DeadLetterReason).
from redrive.reasons import DeadLetterReason as DeadLetterReason

# --------------------------------------------------------------------------- errors


class PolicyError(ValueError):
    """A policy or schedule spec is invalid: says what is wrong and what is expected.

    ``position`` is the 0-based offset of the offending token in a string spec.
    """

    def __init__(self, message: str, *, position: int | None = None) -> None:
        super().__init__(message)
        self.position = position


class FatalError(Exception):
    """Raise (or subclass, or raise ``from`` a cause) to dead-letter without retrying."""


class RetryableError(Exception):
    """Raise (or subclass) to retry even when the cause would be fatal or unlisted."""


# ------------------------------------------------------------------------ durations

UNITS: Final[dict[str, int]] = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
"""Duration units and their length in milliseconds."""
MAX_DELAY_MS: Final = 3650 * UNITS["d"]
"""No duration may exceed ten years; also the ceiling of an uncapped exponential."""

_EXPECTED_DURATION: Final = "expected a duration like 5m, 1.5s or 1h30m (units ms, s, m, h, d)"
_DURATION_PART: Final = re.compile(
    r"\s*(?P<num>[0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*(?P<unit>[A-Za-z]*)"
)


def _fail(context: str, problem: str, position: int | None, expected: str) -> PolicyError:
    where = f" at position {position}" if position is not None else ""
    return PolicyError(f"{context}: {problem}{where}; {expected}", position=position)


def _parse_duration(text: str, context: str, offset: int = 0) -> int:
    """Milliseconds in ``text`` (``"1h30m"``); errors point at ``offset + index``."""
    if not text.strip():
        raise _fail(context, "missing duration", offset, _EXPECTED_DURATION)
    total, pos = Decimal(0), 0
    while text[pos:].strip():
        match = _DURATION_PART.match(text, pos)
        start = offset + len(text[pos:]) - len(text[pos:].lstrip()) + pos
        if match is None:
            token = text[pos:].split()[0]
            raise _fail(context, f"unexpected {token!r}", start, _EXPECTED_DURATION)
        number, unit = match["num"], match["unit"]
        if not unit:
            raise _fail(context, f"missing unit after {number!r}", start, _EXPECTED_DURATION)
        if unit not in UNITS:
            problem = f"unknown unit {unit!r} in {number + unit!r}"
            raise _fail(context, problem, start, _EXPECTED_DURATION)
        total += Decimal(number) * UNITS[unit]
        pos = match.end()
    return _checked_ms(total, context, offset, text.strip())


def _checked_ms(ms: Decimal, context: str, position: int | None, shown: str) -> int:
    if ms < 0:
        raise _fail(context, f"{shown} is negative", position, _EXPECTED_DURATION)
    if ms != ms.to_integral_value():
        raise _fail(context, f"{shown} is finer than a millisecond", position, _EXPECTED_DURATION)
    if ms > MAX_DELAY_MS:
        limit = format_duration(MAX_DELAY_MS)
        raise _fail(context, f"{shown} is longer than {limit}", position, _EXPECTED_DURATION)
    return int(ms)


def parse_duration(text: str) -> int:
    """Milliseconds in a duration string: ``"5m"`` -> 300000, ``"1.5s"``, ``"1h30m"``.

    Units ms, s, m, h, d (lower case); decimals and spaces allowed; whole milliseconds.
    """
    return _parse_duration(text, f"duration {text!r}")


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


def _seconds_to_ms(value: object, context: str, position: int | None = None) -> int:
    """A number of seconds (int or float, not bool) as whole milliseconds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(context, f"{value!r} is not a number", position, "expected seconds >= 0")
    if not math.isfinite(value) or value < 0:
        raise _fail(context, f"{value!r} is not >= 0", position, "expected seconds >= 0")
    return _checked_ms(Decimal(repr(value)) * 1000, context, position, repr(value))


def to_ms(value: str | float | timedelta, what: str = "duration") -> int:
    """A duration given as text (``"1h"``), seconds (``3600``) or a timedelta, in ms."""
    if isinstance(value, timedelta):
        return _checked_ms(Decimal(value // timedelta(milliseconds=1)), what, None, str(value))
    if isinstance(value, str):
        return _parse_duration(value, f"{what} {value!r}")
    return _seconds_to_ms(value, what)


def _format_number(value: float) -> str:
    """Exact, short text for a float (``2.0`` -> ``"2"``) so specs round-trip."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


# ------------------------------------------------------------------------ schedules

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
        cap, growth = self.cap_ms, attempt - 1
        if self.multiplier == 1 or growth == 0:
            return min(cap, self.initial_ms)
        if growth * math.log(self.multiplier) >= math.log(cap / self.initial_ms):
            return cap  # checked in log space: the power itself could overflow
        return min(cap, round(self.initial_ms * self.multiplier**growth))

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
        parts.append(f"x{_format_number(self.multiplier)}")
        if self.max_delay_ms is not None:
            parts.append(f"max {format_duration(self.max_delay_ms)}")
        if self.jitter:
            parts.append(f"jitter {_format_number(self.jitter)}")
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
            raise _fail(context, "empty item", start, _EXPECTED_SCHEDULE)
        x_at = item.lower().find("x")
        if x_at < 0:
            steps.append(Step(_parse_duration(item, context, start)))
            continue
        delay = _parse_duration(item[:x_at], context, start)
        token = item[x_at + 1 :].strip()
        if token == "*":  # noqa: S105  # not a password: "x*" repeats forever
            if index != len(items) - 1:
                problem = "'x*' (repeat forever) is only allowed on the last item"
                raise _fail(context, problem, start + x_at, _EXPECTED_SCHEDULE)
            steps.append(Step(delay, None))
        elif token.isascii() and token.isdigit() and int(token) >= 1:
            steps.append(Step(delay, int(token)))
        else:
            problem = f"bad repeat count {'x' + token!r}"
            raise _fail(context, problem, start + x_at, _EXPECTED_SCHEDULE)
    return DelaySchedule(tuple(steps))


def _parse_number(token: str, context: str, position: int, what: str) -> float:
    try:
        value = float(token)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or token.strip() != token:
        raise _fail(context, f"{what} {token!r} is not a number", position, _EXPECTED_EXPONENTIAL)
    return value


def _parse_exponential(spec: str, context: str) -> ExponentialBackoff:
    """Parse ``"exponential 1s x2 max 5m jitter 0.2 retries 8"`` (commas optional)."""
    tokens = [(m.group(), m.start()) for m in re.finditer(r"[^\s,]+", spec)]
    if len(tokens) < 2:
        raise _fail(context, "missing initial delay", len(spec), _EXPECTED_EXPONENTIAL)
    initial = _parse_duration(tokens[1][0], context, tokens[1][1])
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
            raise _fail(context, problem, position, _EXPECTED_EXPONENTIAL)
        if key in options:
            raise _fail(context, f"{key!r} given twice", position, _EXPECTED_EXPONENTIAL)
        if not word:  # the value is the next token: "max 5m", "x 2"
            if not queue:
                problem = f"missing value after {key!r}"
                raise _fail(context, problem, len(spec), _EXPECTED_EXPONENTIAL)
            word, position = queue.pop(0)
        if key == "max":
            options[key] = _parse_duration(word, context, position)
        elif key == "retries":
            if not (word.isascii() and word.isdigit()):
                problem = f"retries {word!r} is not a whole number"
                raise _fail(context, problem, position, _EXPECTED_EXPONENTIAL)
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
        raise _fail(context, problem, error.pos, expected) from None
    if not isinstance(value, list):
        raise PolicyError(f"{context}: expected a JSON list of seconds like [10, 60, 300]")
    return _from_sequence(value, context)


def _from_sequence(items: Sequence[object], context: str) -> DelaySchedule:
    """Delays from a list: numbers are seconds, strings durations, or timedeltas."""
    delays: list[int] = []
    for index, item in enumerate(items):
        where = f"{context}: item {index + 1}"
        if isinstance(item, str):
            delays.append(_parse_duration(item, where))
        elif isinstance(item, timedelta):
            delays.append(to_ms(item, where))
        else:
            delays.append(_seconds_to_ms(item, where))
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


# ------------------------------------------------------------------------ decisions


@dataclass(frozen=True, slots=True)
class Retry:
    """Bring the message back at ``at_ms`` (epoch ms), ``delay_ms`` after the failure.

    ``attempt`` is the failed-attempt count to write in ``redrive-attempt`` and
    ``deadline_ms`` the deadline to write in ``redrive-deadline`` (None: no deadline).
    """

    at_ms: int
    delay_ms: int
    attempt: int
    deadline_ms: int | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Give up: ``reason`` for machines, ``text`` for people (``str()`` is the text)."""

    reason: DeadLetterReason
    text: str
    attempt: int

    def __str__(self) -> str:
        return self.text


Decision: TypeAlias = Retry | DeadLetter


@dataclass(frozen=True, slots=True)
class Verdict:
    """How an error was classified, and which rule on which exception decided it."""

    retryable: bool
    rule: str
    exception: BaseException | None


def cause_chain(error: BaseException) -> Iterator[BaseException]:
    """The error, then what caused it, as Python's tracebacks show them.

    Follows ``__cause__`` (``raise ... from``), else ``__context__`` unless suppressed
    (``raise ... from None``); stops on cycles.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        if current.__cause__ is not None:
            current = current.__cause__
        elif current.__suppress_context__:
            current = None
        else:
            current = current.__context__


# --------------------------------------------------------------------------- policy

Predicate: TypeAlias = Callable[[BaseException], bool | None]
"""Classifies one exception: True retry, False fatal, None no opinion."""
DeadlineBase: TypeAlias = Literal["first-failure", "record-timestamp"]
ExceptionTypes: TypeAlias = tuple[type[BaseException], ...]

_DEFAULT_RNG: Final = random.Random()  # noqa: S311  # jitter spreads load, no secrecy needed


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _attempts_text(attempt: int, limit: int) -> str:
    shown = f"{attempt} of {limit}" if attempt == limit else f"{attempt}, limit {limit}"
    return f"attempts exhausted ({shown})"


@dataclass(frozen=True, slots=True)
class Policy:
    """What to do after a failure: a schedule, limits, and an error classification.

    Build one with :func:`policy` (or ``Policy.parse``), which accepts every schedule
    form. ``max_attempts`` counts handler runs, the first delivery included: after
    failed attempt ``max_attempts`` the message is dead-lettered. A schedule of n delays
    allows at most n + 1 attempts. ``max_duration_ms`` sets a deadline measured from
    the first failure, or from the original record timestamp with
    ``deadline_from="record-timestamp"``.

    Classification walks the cause chain from the raised error inward; the first
    exception that gets a verdict decides. For each exception: the ``retryable``
    predicate first (True/False; None means no opinion), then the exception types:
    ``fatal_on`` plus :class:`FatalError` versus ``retry_on`` plus
    :class:`RetryableError``, the most specific class in the exception's MRO winning.
    No verdict anywhere: fatal if ``retry_on`` was given (only listed errors are
    retried), otherwise retryable.
    """

    schedule: Schedule
    max_attempts: int | None = None
    max_duration_ms: int | None = None
    deadline_from: DeadlineBase = "first-failure"
    retry_on: ExceptionTypes = ()
    fatal_on: ExceptionTypes = ()
    retryable: Predicate | None = None
    rng: random.Random | None = field(default=None, compare=False, repr=False)
    """Source of jitter; None: a shared module-level generator."""

    def __post_init__(self) -> None:
        if not isinstance(self.schedule, DelaySchedule | ExponentialBackoff):
            raise PolicyError(f"schedule must be a schedule object, got {self.schedule!r}")
        if self.max_attempts is not None and (
            type(self.max_attempts) is not int or self.max_attempts < 1
        ):
            raise PolicyError(f"max_attempts must be an integer >= 1, got {self.max_attempts!r}")
        if self.max_duration_ms is not None and (
            type(self.max_duration_ms) is not int or not 0 <= self.max_duration_ms <= MAX_DELAY_MS
        ):
            raise PolicyError(
                f"max_duration must be between 0s and {format_duration(MAX_DELAY_MS)}, "
                f"got {self.max_duration_ms!r} ms"
            )
        if self.deadline_from not in ("first-failure", "record-timestamp"):
            raise PolicyError(
                f"deadline_from must be 'first-failure' or 'record-timestamp', "
                f"got {self.deadline_from!r}"
            )
        for name in ("retry_on", "fatal_on"):
            types = getattr(self, name)
            if not isinstance(types, tuple) or not all(
                isinstance(t, type) and issubclass(t, BaseException) for t in types
            ):
                raise PolicyError(f"{name} must be exception classes, got {types!r}")
        both = {*self.retry_on, RetryableError} & {*self.fatal_on, FatalError}
        if both:
            names = ", ".join(sorted(qualified_name(t) for t in both))
            raise PolicyError(f"{names} is in both retry_on and fatal_on; pick one")
        if self.retryable is not None and not callable(self.retryable):
            raise PolicyError(f"retryable must be a function, got {self.retryable!r}")
        if self.schedule.retries is None and self.max_attempts is None:
            if self.max_duration_ms is None:
                raise PolicyError(
                    f"schedule {str(self.schedule)!r} never ends: "
                    "set max_attempts or max_duration to bound it"
                )
            if isinstance(self.schedule, DelaySchedule) and self.schedule.steps[-1].delay_ms == 0:
                raise PolicyError(
                    f"schedule {str(self.schedule)!r} retries immediately forever: "
                    "set max_attempts to bound it"
                )

    @classmethod
    def parse(cls, spec: Policy | ScheduleSpec, /, **options: Unpack[PolicyOptions]) -> Policy:
        """Same as :func:`policy`."""
        return policy(spec, **options)

    @property
    def attempt_limit(self) -> int | None:
        """Most attempts the policy allows, by ``max_attempts`` and the schedule's length."""
        limits = [] if self.max_attempts is None else [self.max_attempts]
        if self.schedule.retries is not None:
            limits.append(self.schedule.retries + 1)
        return min(limits, default=None)

    def deadline_ms(
        self, *, first_failure_ms: int, record_timestamp_ms: int | None = None
    ) -> int | None:
        """Epoch ms after which no retry may be due; None without ``max_duration``."""
        if self.max_duration_ms is None:
            return None
        base = first_failure_ms
        if self.deadline_from == "record-timestamp" and record_timestamp_ms is not None:
            base = record_timestamp_ms
        return base + self.max_duration_ms

    def classify(self, error: BaseException) -> Verdict:
        """Retryable or fatal, and why (see the class docstring for the rules)."""
        for exc in cause_chain(error):
            judged = self._judge(exc)
            if judged is not None:
                retryable, rule = judged
                if exc is not error:
                    rule = f"its cause {qualified_name(type(exc))} {rule}"
                return Verdict(retryable, rule, exc)
        if self.retry_on:
            return Verdict(False, "not in retry_on", None)
        return Verdict(True, "retryable by default", None)

    def _judge(self, exc: BaseException) -> tuple[bool, str] | None:
        if self.retryable is not None:
            answer = self.retryable(exc)
            if answer is not None:
                return bool(answer), "retryable by predicate" if answer else "fatal by predicate"
        for cls in type(exc).__mro__:
            if cls is FatalError:
                return False, "is a FatalError"
            if cls is RetryableError:
                return True, "is a RetryableError"
            if cls in self.fatal_on:
                return False, f"matches fatal_on {qualified_name(cls)}"
            if cls in self.retry_on:
                return True, f"matches retry_on {qualified_name(cls)}"
        return None

    def decide(
        self,
        attempt: int,
        error: BaseException | None = None,
        *,
        now_ms: int | None = None,
        first_failure_ms: int | None = None,
        record_timestamp_ms: int | None = None,
        deadline_ms: int | None = None,
        rng: random.Random | None = None,
    ) -> Decision:
        """Retry (when) or dead letter (why), after failed attempt number ``attempt``.

        ``now_ms`` is the failure time (default: the clock); a retry is due at
        ``now_ms + delay``, never earlier. The deadline is the earliest of
        ``deadline_ms`` (pass the ``redrive-deadline`` of a redelivered message) and
        the policy's own, counted from ``record_timestamp_ms`` or ``first_failure_ms``
        (default ``now_ms``, right for attempt 1). Order: fatal error, attempts
        exhausted, deadline.
        """
        if type(attempt) is not int or attempt < 1:
            raise ValueError(f"attempt must be an integer >= 1, got {attempt!r}")
        now = _now_ms() if now_ms is None else now_ms
        if error is not None:
            verdict = self.classify(error)
            if not verdict.retryable:
                text = f"fatal error: {qualified_name(type(error))} ({verdict.rule})"
                return DeadLetter(DeadLetterReason.FATAL_ERROR, text, attempt)
        own = self.deadline_ms(
            first_failure_ms=now if first_failure_ms is None else first_failure_ms,
            record_timestamp_ms=record_timestamp_ms,
        )
        deadlines = [d for d in (deadline_ms, own) if d is not None]
        deadline = min(deadlines) if deadlines else None
        return self._next(attempt, now, deadline, rng or self.rng or _DEFAULT_RNG)

    def _next(
        self, attempt: int, now: int, deadline: int | None, rng: random.Random | None
    ) -> Decision:
        """The schedule and limits part of :meth:`decide`; ``rng=None`` means no jitter."""
        limit = self.attempt_limit
        if limit is not None and attempt >= limit:
            return DeadLetter(
                DeadLetterReason.ATTEMPTS_EXHAUSTED, _attempts_text(attempt, limit), attempt
            )
        prefix = "deadline passed"
        if self.max_duration_ms is not None:
            prefix = f"max duration {format_duration(self.max_duration_ms)} exceeded"
        if deadline is not None and now > deadline:
            text = f"{prefix}: failed {format_duration(now - deadline)} after the deadline"
            return DeadLetter(DeadLetterReason.DEADLINE_PASSED, text, attempt)
        delay = self.schedule.delay_ms(attempt, rng)
        if delay is None:  # cannot happen: attempt < limit; kept for the type checker
            return DeadLetter(DeadLetterReason.ATTEMPTS_EXHAUSTED, "attempts exhausted", attempt)
        if deadline is not None and now + delay > deadline:
            late = format_duration(now + delay - deadline)
            text = (
                f"{prefix}: the next retry, in {format_duration(delay)}, "
                f"would be due {late} after the deadline"
            )
            return DeadLetter(DeadLetterReason.DEADLINE_PASSED, text, attempt)
        return Retry(at_ms=now + delay, delay_ms=delay, attempt=attempt, deadline_ms=deadline)

    def __str__(self) -> str:
        parts = [str(self.schedule)]
        if self.max_attempts is not None:
            parts.append(f"max attempts {self.max_attempts}")
        if self.max_duration_ms is not None:
            since = "first failure" if self.deadline_from == "first-failure" else "record timestamp"
            parts.append(f"max duration {format_duration(self.max_duration_ms)} from {since}")
        if self.retry_on:
            parts.append("retry on " + ", ".join(qualified_name(t) for t in self.retry_on))
        if self.fatal_on:
            parts.append("fatal on " + ", ".join(qualified_name(t) for t in self.fatal_on))
        if self.retryable is not None:
            parts.append("retryable predicate")
        return "; ".join(parts)


class PolicyOptions(TypedDict, total=False):
    """Keyword options of :func:`policy`."""

    max_attempts: int | None
    max_duration: str | float | timedelta | None
    """``"1h"``, seconds, or a timedelta."""
    deadline_from: DeadlineBase
    retry_on: type[BaseException] | Iterable[type[BaseException]]
    fatal_on: type[BaseException] | Iterable[type[BaseException]]
    retryable: Predicate | None
    rng: random.Random | None


def _types(value: object) -> object:
    if isinstance(value, type):
        return (value,)
    return tuple(value) if isinstance(value, Iterable) else value


def policy(spec: Policy | ScheduleSpec, /, **options: Unpack[PolicyOptions]) -> Policy:
    """A :class:`Policy` from a schedule in any form (see :func:`parse_schedule`) and options.

    Given a Policy, returns it with the given options replaced. Raises
    :class:`PolicyError` for a bad spec or option.
    """
    unknown = [name for name in options if name not in PolicyOptions.__annotations__]
    if unknown:
        expected = ", ".join(PolicyOptions.__annotations__)
        raise PolicyError(f"unknown policy option {unknown[0]!r}; expected one of {expected}")
    plain = ("max_attempts", "deadline_from", "retryable", "rng")
    fields: dict[str, Any] = {k: v for k, v in options.items() if k in plain}
    if "max_duration" in options:
        duration = options["max_duration"]
        fields["max_duration_ms"] = None if duration is None else to_ms(duration, "max_duration")
    if "retry_on" in options:
        fields["retry_on"] = _types(options["retry_on"])
    if "fatal_on" in options:
        fields["fatal_on"] = _types(options["fatal_on"])
    if isinstance(spec, Policy):
        return replace(spec, **fields) if fields else spec
    return Policy(parse_schedule(spec), **fields)


# -------------------------------------------------------------------------- explain


@dataclass(frozen=True, slots=True)
class ExplainRow:
    """One handler attempt on the timeline.

    ``elapsed_ms`` is the time since the first failure (handler time not counted),
    ``at_ms`` the same as epoch ms, ``delay_ms`` the wait before the next attempt if
    this one fails, None when this attempt's failure is the last (dead letter).
    """

    attempt: int
    elapsed_ms: int
    at_ms: int
    delay_ms: int | None


@dataclass(frozen=True, slots=True)
class Explanation:
    """What a policy does to a message that keeps failing (see :func:`explain`)."""

    policy: str
    rows: tuple[ExplainRow, ...]
    omitted: int
    """Attempts left out between the shown rows and the last one."""
    outcome: DeadLetter
    notes: tuple[str, ...]


def explain(spec: Policy | ScheduleSpec, start_ms: int = 0, *, max_rows: int = 20) -> Explanation:
    """The timeline of a message that fails every time, first failure at ``start_ms``.

    One row per attempt, then the outcome. Delays are shown without jitter (their
    maximum). Past ``max_rows`` rows, the middle ones are left out and counted; the
    timeline is computed arithmetically, so even "1s x*" over 30 days is instant.
    """
    if max_rows < 2:
        raise ValueError("max_rows must be >= 2")
    chosen = spec if isinstance(spec, Policy) else policy(spec)
    limit = chosen.attempt_limit
    deadline = chosen.deadline_ms(first_failure_ms=start_ms, record_timestamp_ms=start_ms)
    rows: list[ExplainRow] = []
    retries, attempt, elapsed = 0, 1, 0
    for delay, count in chosen.schedule.runs():
        allowed = [n for n in (count,) if n is not None]
        if limit is not None:
            allowed.append(max(0, limit - attempt))
        if deadline is not None and delay > 0:
            allowed.append(max(0, (deadline - start_ms - elapsed) // delay))
        taken = min(allowed)  # bounded: Policy rejects schedules that never end
        for i in range(min(taken, max_rows - 1 - len(rows))):
            done = elapsed + i * delay
            rows.append(ExplainRow(attempt + i, done, start_ms + done, delay))
        retries, attempt, elapsed = retries + taken, attempt + taken, elapsed + taken * delay
        if count is None or taken < count:
            break
    outcome = chosen._next(attempt, start_ms + elapsed, deadline, None)
    if not isinstance(outcome, DeadLetter):  # pragma: no cover - would be a bug above
        raise AssertionError(f"explain stopped early at attempt {attempt}: {outcome}")
    rows.append(ExplainRow(attempt, elapsed, start_ms + elapsed, None))
    notes = ["at: time since the first failure, not counting time spent in the handler"]
    jitter = getattr(chosen.schedule, "jitter", 0.0)
    if jitter:
        low = _format_number(round(100 * (1 - jitter), 4))
        notes.append(f"jitter {_format_number(jitter)}: each delay is drawn from {low}%-100% of it")
    if chosen.max_duration_ms is not None and chosen.deadline_from == "record-timestamp":
        notes.append(
            "max duration counts from the record timestamp, taken here as the first failure"
        )
    return Explanation(str(chosen), tuple(rows), retries + 1 - len(rows), outcome, tuple(notes))


def format_explanation(explanation: Explanation) -> str:
    """Plain-text table of an :func:`explain` timeline, for a terminal."""
    table = [("attempt", "at", "if it fails")]
    for row in explanation.rows:
        then = (
            "dead letter" if row.delay_ms is None else f"retry in {format_duration(row.delay_ms)}"
        )
        table.append((str(row.attempt), f"+{format_duration(row.elapsed_ms)}", then))
    width0 = max(len(r[0]) for r in table)
    width1 = max(len(r[1]) for r in table)
    lines = [f"policy: {explanation.policy}"]
    lines += [f"{a:>{width0}}  {b:>{width1}}  {c}".rstrip() for a, b, c in table]
    if explanation.omitted:
        gap = f"{'...':>{width0}}  {'':>{width1}}  ({explanation.omitted} more attempts)"
        lines.insert(len(lines) - 1, gap)
    lines.append(f"then: dead letter, {explanation.outcome.text}")
    lines += explanation.notes
    return "\n".join(lines)
