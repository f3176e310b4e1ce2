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

The parts live in their own modules and are imported from here: durations and
:class:`PolicyError` in :mod:`redrive.durations`, schedules in :mod:`redrive.schedules`,
the decisions (:class:`Retry`, :class:`DeadLetter`) and :func:`cause_chain` in
:mod:`redrive.decisions`. :class:`FatalError` and :class:`RetryableError` stay here: their
qualified names (``redrive.policy.FatalError``) travel in ``redrive-error-type``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Final, Literal, TypeAlias, TypedDict, Unpack, cast

# The parts of a policy, each in its own module; users import them from here.
from redrive import clock
from redrive.decisions import DeadLetter as DeadLetter
from redrive.decisions import Decision as Decision
from redrive.decisions import Retry as Retry
from redrive.decisions import Verdict as Verdict
from redrive.decisions import cause_chain as cause_chain
from redrive.durations import MAX_DELAY_MS as MAX_DELAY_MS
from redrive.durations import UNITS as UNITS
from redrive.durations import PolicyError as PolicyError
from redrive.durations import format_duration as format_duration
from redrive.durations import parse_duration as parse_duration
from redrive.durations import to_ms as to_ms
from redrive.headers import qualified_name

# Re-exported: a policy's DeadLetter carries one (redrive.policy.DeadLetterReason).
from redrive.reasons import DeadLetterReason as DeadLetterReason
from redrive.schedules import DelaySchedule as DelaySchedule
from redrive.schedules import ExponentialBackoff as ExponentialBackoff
from redrive.schedules import Run as Run
from redrive.schedules import Schedule as Schedule
from redrive.schedules import ScheduleSpec as ScheduleSpec
from redrive.schedules import Step as Step
from redrive.schedules import format_number
from redrive.schedules import parse_schedule as parse_schedule

# --------------------------------------------------------------------------- errors


class FatalError(Exception):
    """Raise (or subclass, or raise ``from`` a cause) to dead-letter without retrying."""


class RetryableError(Exception):
    """Raise (or subclass) to retry even when the cause would be fatal or unlisted."""


# --------------------------------------------------------------------------- policy

Predicate: TypeAlias = Callable[[BaseException], bool | None]
"""Classifies one exception: True retry, False fatal, None no opinion."""
DeadlineBase: TypeAlias = Literal["first-failure", "record-timestamp"]
ExceptionTypes: TypeAlias = tuple[type[BaseException], ...]

_DEFAULT_RNG: Final = random.Random()  # noqa: S311  # jitter spreads load, no secrecy needed


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
        now = clock.now_ms() if now_ms is None else now_ms
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


def policy_among(spec: Policy | ScheduleSpec, options: Mapping[str, object]) -> Policy:
    """:func:`policy` with the policy's options found among wider ones (a handler's, a
    pipeline's); an option given as None or empty counts as not given."""
    given = {
        name: value
        for name, value in options.items()
        if name in PolicyOptions.__optional_keys__ and value not in (None, ())
    }
    return policy(spec, **cast(PolicyOptions, given))


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
        low = format_number(round(100 * (1 - jitter), 4))
        notes.append(f"jitter {format_number(jitter)}: each delay is drawn from {low}%-100% of it")
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
