"""Deadlines for waits on other processes, counted in a quiet machine's seconds.

Starting a broker, a database or a Spark worker takes a known amount of work. On a
machine whose run queue is longer than its cores, that work takes proportionally
longer on the wall clock, and a fixed wall-clock deadline fails a start-up that was
merely slow. A :class:`Deadline` therefore counts each wall-clock second as
``cores / load`` of a second while the load average exceeds the cores, and as a whole
second otherwise: 90 s is 90 s on a quiet machine and up to ``max_stretch`` times that
on a loaded one, so a start-up that hangs still ends.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

DEFAULT_MAX_STRETCH = 4.0
"""How far a deadline may stretch: 4x its seconds at most, whatever the load."""


def machine_load() -> float:
    """The one-minute load average per core (1.0: every core busy, nothing queued)."""
    return os.getloadavg()[0] / (os.cpu_count() or 1)


class Deadline:
    """``seconds`` of a quiet machine's time, starting now.

    Each call to :meth:`passed` or :meth:`remaining` counts the wall time since the
    last call at the current load; so ask from a loop that polls, as waits do.
    """

    def __init__(
        self,
        seconds: float,
        *,
        max_stretch: float = DEFAULT_MAX_STRETCH,
        clock: Callable[[], float] = time.monotonic,
        load: Callable[[], float] = machine_load,
    ) -> None:
        if seconds < 0 or max_stretch < 1:
            raise ValueError(f"a deadline of {seconds} s, stretched {max_stretch}x at most")
        self.seconds = seconds
        self.max_stretch = max_stretch
        self._clock = clock
        self._load = load
        self._started = self._last = clock()
        self._spent = 0.0

    def _advance(self) -> float:
        now = self._clock()
        stretch = min(max(self._load(), 1.0), self.max_stretch)
        self._spent += (now - self._last) / stretch
        self._last = now
        return self._spent

    def passed(self) -> bool:
        return self._advance() >= self.seconds

    def remaining(self) -> float:
        """Quiet-machine seconds left (0 once passed)."""
        return max(self.seconds - self._advance(), 0.0)

    def waited(self) -> float:
        """Wall-clock seconds since the deadline was set."""
        return self._clock() - self._started

    def describe(self) -> str:
        """How long it was, for an error message: "90 s" or "90 s (212 s of a loaded
        machine)"."""
        waited = self.waited()
        if waited > self.seconds * 1.05:
            return f"{self.seconds:.0f} s ({waited:.0f} s of a loaded machine)"
        return f"{self.seconds:.0f} s"
