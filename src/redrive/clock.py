"""The wall clock, in the unit of the header contract: epoch milliseconds.

Every due time, deadline and Kafka timestamp redrive handles is an integer count of
milliseconds since the epoch, so this is the one place that reads the system clock
for them. Code that decides takes a `Clock` argument defaulting to :func:`now_ms`, so
that tests (and the property tests of the policy) can pass a fixed time instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeAlias

Clock: TypeAlias = Callable[[], int]
"""A source of the current time in epoch milliseconds."""


def now_ms() -> int:
    """The wall clock in epoch milliseconds (integer, from the nanosecond clock)."""
    return time.time_ns() // 1_000_000
