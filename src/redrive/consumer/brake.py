"""A route's dead-letter brake: stop handling a route whose dead letters surge. Pure.

A :class:`DeadLetterBrake` holds the settings of one handler's brake (validated with
:class:`redrive.errors.ConfigError`); a :class:`BrakeMachine` is its state, driven by
the route's outcomes and the time, which is passed in (``now_ms``), as is the
randomness (jitter of an exponential open time). No Kafka, no clock, no logging here:
the App's side (the waits that hold the route's partitions, the metrics, the logs,
``/healthz``) is :mod:`redrive.consumer.brakes`.

::

    CLOSED ──(the route's dead letters in the window reach the threshold)──> OPEN
      ^                                                                       │ open time over
      │ the probe is handled                                                  v
      └──────────────────────────────────────────────────────────────── HALF_OPEN
                                                                              │ the probe fails
                  OPEN (opening n + 1, the next, longer open time) <─────────┘

What counts: a dead letter of a record that reached its handler (a fatal error, its
attempts or deadline spent, a policy that raised): what a downstream outage makes.
Records dead-lettered before their handler (headers or value unreadable, redrive's
own failure) are the records' own fault: braking would not change them.

Invariant: the machine opens only when a counted dead letter brings those in the
window to ``dead_letters``, or when the probe of a half-open brake fails (retried or
dead-lettered); it admits no record while open, and while half-open one record (the
probe) until its outcome is known or :data:`PROBE_TIMEOUT_MS` passed without one (a
probe that never reached its handler: another may go); the n-th opening in a row
lasts the ``open_for`` schedule's n-th delay (its last once spent). A close starts
counting afresh.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta

from redrive.consumer.breaker import Breaker, BreakerState, Transition
from redrive.durations import format_duration
from redrive.errors import ConfigError
from redrive.schedules import ScheduleSpec

__all__ = ["PROBE_TIMEOUT_MS", "BrakeMachine", "BreakerState", "DeadLetterBrake", "Transition"]

PROBE_TIMEOUT_MS = 10_000
"""A half-open brake whose probe said nothing for this long admits another: the probe
may have gone behind its key, or left with its partition in a rebalance."""


@dataclass(frozen=True)
class DeadLetterBrake:
    """The settings of a handler's dead-letter brake.

    - ``dead_letters``: how many dead letters of the route within ``window`` open it
      (at least 1);
    - ``window``: a duration (``"1m"``, seconds, a timedelta) over which they count;
    - ``open_for``: how long it stays open, as a schedule (the policies' syntax):
      ``"30s"``, a list (``"30s, 2m, 10m"``: the n-th opening in a row waits the n-th
      delay, then the last), or ``"exponential 30s x2 max 10m"`` (which needs its
      ``max``).
    """

    dead_letters: int = 100
    window: str | float | timedelta = "1m"
    open_for: ScheduleSpec = "exponential 30s x2 max 10m"
    timing: Breaker = field(init=False, repr=False, compare=False)
    """The window and open times, checked and parsed as a circuit breaker's are."""

    def __post_init__(self) -> None:
        count = self.dead_letters
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(
                "DeadLetterBrake(dead_letters=...)",
                f"{count!r} is not a whole number >= 1",
                "e.g. 100: the dead letters within the window that open the brake",
            )
        try:
            timing = Breaker(failures=count, window=self.window, open_for=self.open_for)
        except ConfigError as exc:  # the same rules, named as the user wrote them
            setting = exc.setting.replace("Breaker(", "DeadLetterBrake(")
            raise ConfigError(setting, exc.problem.replace("breaker", "brake"), exc.fix) from None
        object.__setattr__(self, "timing", timing)

    @property
    def window_ms(self) -> int:
        return self.timing.window_ms

    def per_minute(self, dead_letters: int) -> float:
        """``dead_letters`` within the window, as a rate per minute."""
        return round(dead_letters * 60_000 / self.window_ms, 1)

    def __str__(self) -> str:
        window = format_duration(self.window_ms)
        return f"{self.dead_letters} dead letters in {window}, open for {self.timing.schedule}"


class BrakeMachine:
    """One route's brake (see the module). Each method takes the current time.

    :meth:`admit` before a record is handled (only needed when not closed); then the
    record's outcome: :meth:`dead_lettered`, :meth:`retried` or :meth:`handled`. A
    method that changes the state returns the :class:`Transition`, else None.
    :meth:`tick` moves an open brake whose time is over to half-open.
    """

    def __init__(self, settings: DeadLetterBrake, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.rng = rng
        self.state = BreakerState.CLOSED
        self.openings = 0
        """Openings in a row since the brake last closed."""
        self.open_until_ms: int | None = None
        self.probe_since_ms: int | None = None
        """When the half-open brake's probe was admitted (None: none is out)."""
        self._times: deque[int] = deque()
        """Times of the counted dead letters in the window (at most ``dead_letters``:
        only the last ones matter)."""

    def tick(self, now_ms: int) -> Transition | None:
        """An open brake whose open time is over becomes half-open."""
        until = self.open_until_ms
        if self.state is BreakerState.OPEN and until is not None and now_ms >= until:
            self.probe_since_ms = None
            return self._to(BreakerState.HALF_OPEN, "open time over: one record may pass")
        return None

    def admit(self, now_ms: int) -> bool:
        """May a record reach its handler now? Closed: yes. Open: no. Half-open: one,
        the probe, until its outcome is known or it timed out. Call :meth:`tick` first."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            return False
        since = self.probe_since_ms
        if since is not None and now_ms - since < PROBE_TIMEOUT_MS:
            return False
        self.probe_since_ms = now_ms
        return True

    def dead_lettered(self, now_ms: int) -> Transition | None:
        """A record that reached its handler became a dead letter: counted while closed
        (may open the brake); a half-open brake's probe failed (open again, longer)."""
        if self.state is BreakerState.HALF_OPEN:
            return self._open(now_ms, "the probe was dead-lettered")
        if self.state is BreakerState.OPEN:
            return None  # a record taken before it opened: already braked
        times = self._times
        times.append(now_ms)
        start = now_ms - self.settings.window_ms
        while times and times[0] <= start:
            times.popleft()
        if len(times) > self.settings.dead_letters:
            times.popleft()
        if len(times) < self.settings.dead_letters:
            return None
        settings = self.settings
        window = format_duration(settings.window_ms)
        count, rate = len(times), settings.per_minute(len(times))
        letters = "dead letter" if count == 1 else "dead letters"
        return self._open(now_ms, f"{count} {letters} in {window} ({rate:g}/min)")

    def retried(self, now_ms: int) -> Transition | None:
        """A record failed and was retried: says nothing while closed (only dead letters
        count); a half-open brake's probe failed (open again, longer)."""
        if self.state is BreakerState.HALF_OPEN:
            return self._open(now_ms, "the probe failed again")
        return None

    def handled(self, now_ms: int) -> Transition | None:
        """A record's handler succeeded: a half-open brake closes."""
        if self.state is BreakerState.HALF_OPEN:
            self.openings = 0
            self.open_until_ms = None
            self.probe_since_ms = None
            return self._to(BreakerState.CLOSED, "the probe was handled")
        return None

    def dead_letters_in_window(self, now_ms: int) -> int:
        start = now_ms - self.settings.window_ms
        return sum(1 for at in self._times if at > start)

    def _open(self, now_ms: int, why: str) -> Transition:
        self.openings += 1
        open_ms = self.settings.timing.open_ms(self.openings, self.rng)
        self.open_until_ms = now_ms + open_ms
        self.probe_since_ms = None
        self._times.clear()
        text = f"{why}; open #{self.openings} for {format_duration(open_ms)}"
        return self._to(BreakerState.OPEN, text, self.open_until_ms)

    def _to(self, new: BreakerState, why: str, open_until_ms: int | None = None) -> Transition:
        old, self.state = self.state, new
        return Transition(old, new, why, open_until_ms)
