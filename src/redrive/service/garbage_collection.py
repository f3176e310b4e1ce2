"""CPython's cyclic garbage collector, set for a long-running service.

Intake and the scheduler make some tens of container objects per request (messages,
header tuples, rows), nearly all freed by reference counting once their batch is
stored or delivered. With the interpreter's default thresholds (700, 10, 10) a batch
of 2,000 requests sets off about eighty young collections while its objects are still
alive: they are promoted, and their numbers set off full collections, each of which
walks every object the process holds (its modules, settings, web application). Under
benchmark 2 that was most of the time the collector took, several microseconds per
request (docs/benchmarks.md).

Two remedies from the `gc` module's own documentation, invariant kept: every cycle of
garbage is still collected.

- :func:`gc.freeze` once start-up is done: what start-up built lives as long as the
  process, and frozen objects are never walked again (reference counting still frees
  any that go).
- A young collection after :data:`YOUNG_THRESHOLD` allocations instead of 700, about
  one batch's worth: by then most of a batch's objects are gone, so few are promoted.
  Cycles wait longer for their collection; the memory they hold meanwhile is small.

Process-wide settings, so the process's entry point applies them: `redrive serve` and
each of its workers. A program that embeds a :class:`RetryService` (the demo, tests)
keeps its own collector as it is.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000


def settle_after_start_up() -> None:
    """Freeze what start-up built and collect the young generation less often."""
    gc.collect()  # start-up's own garbage is not frozen with it
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
