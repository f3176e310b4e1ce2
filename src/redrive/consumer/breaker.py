"""The ``pause`` strategy's circuit breaker: closed, open, half-open. Pure.

A :class:`Breaker` holds the settings of one handler's breaker (validated with
:class:`redrive.errors.ConfigError`); a :class:`BreakerMachine` is its state, driven
by what happened and when: the time is passed in (``now_ms``), so is the randomness
(jitter of an exponential open time). No Kafka, no clock, no logging here: the
App's side (the waits that pause every partition through
:class:`redrive.consumer.pauses.PauseBook`, the metric, the hook, the logs) is in
:mod:`redrive.consumer.strategies.pause`.

::

    CLOSED ──(failures in the window reach the threshold)──> OPEN (opening 1)
      ^                                                        │ open time over
      │                                                        v
      └────────────(the probe succeeds)─────────────────── HALF_OPEN
                                                               │ the probe fails
                   OPEN (opening n + 1, the next, longer open time) <┘

Invariant: the machine opens only when a counted failure brings the failures in the
window to ``failures`` (and, with ``ratio``, the share of failed calls in the window
to ``ratio``), or when the probe of a half-open breaker fails; it admits no call
while open, and at most one call (the probe) at a time while half-open; the n-th
opening in a row lasts the ``open_for`` schedule's n-th delay (its last once spent),
never longer than the schedule's cap. A close starts counting afresh.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from enum import IntEnum

from redrive.durations import PolicyError, format_duration, to_ms
from redrive.errors import ConfigError
from redrive.schedules import (
    DelaySchedule,
    ExponentialBackoff,
    Schedule,
    ScheduleSpec,
    parse_schedule,
)

__all__ = ["Breaker", "BreakerMachine", "BreakerState", "Transition"]


class BreakerState(IntEnum):
    """A breaker's state; the values are those of ``redrive_consumer_breaker_state``."""

    CLOSED = 0
    """Records flow; failures are counted."""
    OPEN = 1
    """Every assigned partition waits; no record is handled."""
    HALF_OPEN = 2
    """One record (the probe) is let through: its outcome closes or reopens."""


@dataclass(frozen=True)
class Breaker:
    """The settings of a ``pause`` handler's circuit breaker.

    - ``failures``: how many counted failures within ``window`` open it (at least 1);
    - ``window``: a duration (``"30s"``, seconds, a timedelta) over which they count;
    - ``ratio``: if given (0 < ratio <= 1), it opens only when also at least this share
      of the calls in the window failed (``failures`` is then the least number of
      failures that can open it);
    - ``open_for``: how long it stays open, as a schedule: ``"5s"`` (always 5 s), a
      list (``"5s, 30s, 2m"``: the first opening 5 s, the second in a row 30 s, then
      2 m), or exponential backoff ``"exponential 5s x2 max 5m"`` (which needs its
      ``max``). The n-th opening in a row (reopened by a failed probe) waits the n-th
      delay; once the schedule is spent, its last. An exponential's jitter shortens
      each opening at random.
    """

    failures: int = 5
    window: str | float | timedelta = "30s"
    ratio: float | None = None
    open_for: ScheduleSpec = "exponential 5s x2 max 5m"
    window_ms: int = field(init=False, repr=False)
    schedule: Schedule = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.failures, bool) or not isinstance(self.failures, int):
            raise _error("failures", f"{self.failures!r} is not a whole number", "e.g. 5")
        if self.failures < 1:
            raise _error("failures", f"{self.failures} is less than 1", "e.g. 5")
        try:
            window_ms = to_ms(self.window, "window")
        except PolicyError as exc:
            raise _error("window", str(exc), 'a duration such as "30s"') from None
        if window_ms <= 0:
            raise _error("window", "must be longer than 0", 'a duration such as "30s"')
        ratio = self.ratio
        if ratio is not None and (
            isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 1
        ):
            raise _error("ratio", f"{ratio!r} is not a number in (0, 1]", "e.g. 0.5, or None")
        try:
            schedule = parse_schedule(self.open_for)
        except PolicyError as exc:
            raise _error("open_for", str(exc), 'e.g. "5s" or "exponential 5s x2 max 5m"') from None
        if isinstance(schedule, ExponentialBackoff) and schedule.max_delay_ms is None:
            raise _error(
                "open_for",
                f"{str(schedule)!r} has no cap: the breaker could stay open for years",
                f'add a max, e.g. "{schedule} max 5m"',
            )
        if isinstance(schedule, DelaySchedule) and any(s.delay_ms == 0 for s in schedule.steps):
            raise _error("open_for", "an open time of 0s opens nothing", 'e.g. "5s"')
        object.__setattr__(self, "window_ms", window_ms)
        object.__setattr__(self, "schedule", schedule)

    def open_ms(self, opening: int, rng: random.Random | None = None) -> int:
        """How long the ``opening``-th opening in a row lasts (1-based); jittered when
        the schedule has jitter and ``rng`` is given."""
        if opening < 1:
            raise ValueError(f"opening must be >= 1, got {opening!r}")
        retries = self.schedule.retries
        if retries is not None:
            opening = min(opening, retries)
        delay = self.schedule.delay_ms(opening, rng)
        assert delay is not None  # opening <= retries
        return delay

    def cap_ms(self) -> int:
        """The longest an opening can last."""
        schedule = self.schedule
        if isinstance(schedule, ExponentialBackoff):
            return schedule.cap_ms
        return max(step.delay_ms for step in schedule.steps)

    def __str__(self) -> str:
        text = f"{self.failures} failures in {format_duration(self.window_ms)}"
        if self.ratio is not None:
            text += f" and a failure ratio of {self.ratio:g}"
        return f"{text}, open for {self.schedule}"


def _error(name: str, problem: str, fix: str) -> ConfigError:
    return ConfigError(f"Breaker({name}=...)", problem, fix)


@dataclass(frozen=True, slots=True)
class Transition:
    """A change of state, and why (for the logs, the metric and ``on_breaker``)."""

    old: BreakerState
    new: BreakerState
    why: str
    open_until_ms: int | None = None
    """When it was opened: until when."""


class BreakerMachine:
    """One breaker's state (see the module). Each method takes the current time.

    Calls go: :meth:`admit` before a handler runs (only needed when not closed), then
    one of :meth:`success`, :meth:`failure` (a counted failure) or :meth:`ignored`
    (a call whose outcome says nothing about the downstream). A method that changes
    the state returns the :class:`Transition`, else None. :meth:`tick` moves an open
    breaker whose time is over to half-open.
    """

    def __init__(self, settings: Breaker, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.rng = rng
        self.state = BreakerState.CLOSED
        self.openings = 0
        """Openings in a row since the breaker last closed."""
        self.open_until_ms: int | None = None
        self.probing = False
        """Whether the half-open breaker's probe is under way."""
        self._failures: deque[int] = deque()
        """Times of the counted failures in the window (at most ``failures`` of them
        without a ratio: only the last ones matter)."""
        self._calls: deque[list[int]] = deque()
        """With a ratio: [time, calls] in the window, calls at one time added up."""
        self._calls_total = 0

    # ----------------------------------------------------------------- time

    def tick(self, now_ms: int) -> Transition | None:
        """An open breaker whose open time is over becomes half-open."""
        until = self.open_until_ms
        if self.state is BreakerState.OPEN and until is not None and now_ms >= until:
            return self._to(BreakerState.HALF_OPEN, "open time over: one record may pass")
        return None

    def admit(self, now_ms: int) -> bool:
        """May a call run now? Closed: yes. Open: no. Half-open: yes for one call (the
        probe) until its outcome is reported, then no. Call :meth:`tick` first: an
        open breaker stays open until a tick says its time is over."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN or self.probing:
            return False
        self.probing = True
        return True

    # ----------------------------------------------------------------- outcomes

    def success(self, now_ms: int, calls: int = 1) -> Transition | None:
        """``calls`` calls succeeded; a half-open breaker closes."""
        if self.state is BreakerState.HALF_OPEN:
            if not self.probing:
                return None  # no probe was admitted: not a probe's outcome
            return self._close("the probe succeeded")
        if self.state is BreakerState.CLOSED and self.settings.ratio is not None:
            self._count_calls(now_ms, calls)
        return None

    def failure(self, now_ms: int) -> Transition | None:
        """A counted failure (a retryable one, see the docs): may open the breaker;
        a half-open breaker's failed probe reopens it for the next, longer time."""
        if self.state is BreakerState.HALF_OPEN:
            if not self.probing:
                return None
            return self._open(now_ms, "the probe failed")
        if self.state is not BreakerState.CLOSED:
            return None  # no call runs while open
        settings = self.settings
        self._failures.append(now_ms)
        if settings.ratio is not None:
            self._count_calls(now_ms, 1)
        self._forget_before(now_ms - settings.window_ms)
        if settings.ratio is None and len(self._failures) > settings.failures:
            self._failures.popleft()
        failed = len(self._failures)
        window = format_duration(settings.window_ms)
        if failed < settings.failures:
            return None
        if settings.ratio is None:
            return self._open(now_ms, f"{failed} failures in {window}")
        if failed < settings.ratio * self._calls_total:
            return None
        return self._open(
            now_ms,
            f"{failed} of {self._calls_total} calls failed in {window} (ratio {settings.ratio:g})",
        )

    def ignored(self, now_ms: int) -> None:
        """A call ended in a way that says nothing of the downstream (a fatal error:
        the record's own fault): a half-open breaker's next call is the probe."""
        self.probing = False

    # ----------------------------------------------------------------- queries

    def failures_in_window(self, now_ms: int) -> int:
        self._forget_before(now_ms - self.settings.window_ms)
        return len(self._failures)

    # ----------------------------------------------------------------- internals

    def _count_calls(self, now_ms: int, calls: int) -> None:
        if self._calls and self._calls[-1][0] == now_ms:
            self._calls[-1][1] += calls
        else:
            self._calls.append([now_ms, calls])
        self._calls_total += calls
        self._forget_before(now_ms - self.settings.window_ms)

    def _forget_before(self, start_ms: int) -> None:
        """Drop what happened at or before ``start_ms``: out of the window."""
        failures = self._failures
        while failures and failures[0] <= start_ms:
            failures.popleft()
        calls = self._calls
        while calls and calls[0][0] <= start_ms:
            self._calls_total -= calls.popleft()[1]

    def _open(self, now_ms: int, why: str) -> Transition:
        self.openings += 1
        open_ms = self.settings.open_ms(self.openings, self.rng)
        self.open_until_ms = now_ms + open_ms
        self._failures.clear()
        self._calls.clear()
        self._calls_total = 0
        self.probing = False
        text = f"{why}; open #{self.openings} for {format_duration(open_ms)}"
        return self._to(BreakerState.OPEN, text, self.open_until_ms)

    def _close(self, why: str) -> Transition:
        self.openings = 0
        self.open_until_ms = None
        self.probing = False
        return self._to(BreakerState.CLOSED, why)

    def _to(self, new: BreakerState, why: str, open_until_ms: int | None = None) -> Transition:
        old, self.state = self.state, new
        if new is BreakerState.HALF_OPEN:
            self.probing = False
        return Transition(old, new, why, open_until_ms)
