"""`--cpu-report FILE`: the CPU each test costs, written as JSON lines.

On 2 cores the suite is bound by CPU, so a test's cost is the CPU its processes
spend, not its wall time (which another worker's burst stretches). Each pytest
process samples, on a thread of its own, every process carrying its session mark
(see leftovers.py: the brokers, databases, JVMs and commands it started, also those
that detached) and adds up their CPU; a test is charged what that sum and its own
process grew by from its setup to its teardown. A process that lives less than a
sampling interval is missed, the last interval of one that ends is lost: the
figures are a floor, good for finding where the time goes.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.plugins.leftovers import MARK

SAMPLE_S = 0.25


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-report",
        default=None,
        help="write each test's CPU seconds (its processes' and this one's) to this file",
    )


class Sampler:
    """A monotonic count of the CPU seconds spent by the processes with the mark, and
    of its own thread's (which the test's own figure leaves out)."""

    def __init__(self, mark: str) -> None:
        self.mark = mark
        # Every process seen, with its last CPU figure (None: not one of ours; each
        # environment is read once).
        self.seen: dict[int, tuple[psutil.Process, float | None]] = {}
        self.own_s = 0.0
        self.lock = threading.Lock()
        threading.Thread(target=self._run, name="cpu-report", daemon=True).start()

    def _run(self) -> None:
        while True:
            started = time.thread_time()
            self.sample()
            with self.lock:
                self.own_s += time.thread_time() - started
            time.sleep(SAMPLE_S)

    def sample(self) -> None:
        for proc in psutil.process_iter():
            if proc.pid == os.getpid():
                continue
            try:
                known = self.seen.get(proc.pid)
                if known is None or known[0] != proc:
                    ours = proc.environ().get(MARK) == self.mark
                    known = (proc, 0.0 if ours else None)
                if known[1] is None:
                    self.seen[proc.pid] = known
                    continue
                times = proc.cpu_times()
                with self.lock:
                    self.seen[proc.pid] = (proc, times.user + times.system)
            except psutil.Error:
                continue

    def totals(self) -> tuple[float, float]:
        """(the marked processes' CPU seconds, this process's but the sampler's)."""
        self.sample()
        with self.lock:
            others = sum(cpu for _, cpu in self.seen.values() if cpu is not None)
            return others, time.process_time() - self.own_s


_sampler: Sampler | None = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    global _sampler
    path = item.config.getoption("--cpu-report")
    if not path:
        yield
        return
    if _sampler is None:
        _sampler = Sampler(os.environ[MARK])
    before_others, before_own = _sampler.totals()
    started = time.monotonic()
    yield
    after_others, after_own = _sampler.totals()
    others, own = after_others - before_others, after_own - before_own
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = {
        "test": item.nodeid,
        "worker": worker,
        "cpu_s": round(others + own, 2),
        "own_cpu_s": round(own, 2),
        "wall_s": round(time.monotonic() - started, 2),
    }
    with Path(f"{path}.{worker}").open("a") as out:
        out.write(json.dumps(line) + "\n")
