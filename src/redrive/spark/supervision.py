"""Streaming queries started again, from their checkpoints, after they fail.

Spark retries a failed task (``spark.task.maxFailures``), but a failure outside the
tasks ends the whole query and Spark never starts it again: a Python worker that a
busy driver could not start within Spark's fixed ten seconds, the Kafka cluster out
of reach for longer than the connector waits, an executor lost past the task
retries. A :class:`Supervised` query knows how to start itself, and
:func:`redrive.spark.session.run_until_stopped` starts it again when it fails, after
a pause, at most ``Restarts.at_most`` times within ``Restarts.within_s`` seconds. A
failure that comes back more often than that is not one a restart cures: it is
raised, as an unsupervised query's failure is.

Invariant: a restart is a driver restart without the driver. The query resumes from
its last committed batch; the batch that failed runs again, and what it had written
is written exactly once by the default transactional sinks, at least once otherwise,
which the receivers' idempotence on the failure's identity absorbs.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from redrive.errors import ConfigError

log = structlog.get_logger("redrive.spark")


@dataclass(frozen=True)
class Restarts:
    """How often a failed query is started again before its failure is raised."""

    at_most: int = 3
    """Restarts allowed within ``within_s``; 0 raises the first failure."""
    within_s: float = 600.0
    """The window the restarts are counted in: older failures are forgotten."""
    pause_s: float = 2.0
    """The wait before a restart, so that a broker or a worker has time to return."""

    def __post_init__(self) -> None:
        if self.at_most < 0:
            raise ConfigError("restarts.at_most", f"{self.at_most} is negative", "give 0 or more")
        if self.within_s <= 0:
            raise ConfigError(
                "restarts.within_s", f"{self.within_s} is not positive", "give a window in seconds"
            )
        if self.pause_s < 0:
            raise ConfigError(
                "restarts.pause_s", f"{self.pause_s} is negative", "give 0 or more seconds"
            )


class Watched(Protocol):
    """What :func:`run_until_stopped` waits on: a query, supervised or not."""

    def ended(self, timeout_s: float, stop: threading.Event) -> bool:
        """Wait up to ``timeout_s``; True once the query has stopped for good. A
        failure it does not take care of is raised."""

    def stop(self) -> None:
        """Stop the query (a running micro-batch is interrupted)."""


class Unsupervised:
    """A started query as it is: its failure is raised."""

    def __init__(self, query: Any) -> None:
        self.query = query

    def ended(self, timeout_s: float, stop: threading.Event) -> bool:
        return bool(self.query.awaitTermination(timeout_s))

    def stop(self) -> None:
        self.query.stop()


class Supervised:
    """A query and how to start it: started now, and again after each failure that
    ``restarts`` allows.

    ``start`` starts the query and returns it, e.g.
    ``lambda: start_pipeline(spark, ..., checkpoint="...")``; each call must use the
    same checkpoint, so that a restart resumes where the failed query was.
    """

    def __init__(self, start: Callable[[], Any], restarts: Restarts | None = None) -> None:
        self._start = start
        self.restarts = restarts or Restarts()
        self._failures: deque[float] = deque()
        self.restarted = 0
        """How many times the query was started again."""
        self.query = start()

    def ended(self, timeout_s: float, stop: threading.Event) -> bool:
        from pyspark.errors import StreamingQueryException

        try:
            return bool(self.query.awaitTermination(timeout_s))
        except StreamingQueryException as failure:
            self._restart_or_raise(failure, stop)
            return False

    def stop(self) -> None:
        self.query.stop()

    def _restart_or_raise(self, failure: Exception, stop: threading.Event) -> None:
        name = self.query.name or str(self.query.id)
        while True:
            now = time.monotonic()
            while self._failures and now - self._failures[0] > self.restarts.within_s:
                self._failures.popleft()
            if len(self._failures) >= self.restarts.at_most:
                log.error(
                    "query failed too often to restart",
                    query=name,
                    failures=len(self._failures) + 1,
                    within_s=self.restarts.within_s,
                    error=_reason(failure),
                )
                raise failure
            self._failures.append(now)
            log.warning(
                "query failed; starting it again from its checkpoint",
                query=name,
                restart=len(self._failures),
                at_most=self.restarts.at_most,
                pause_s=self.restarts.pause_s,
                error=_reason(failure),
            )
            if stop.wait(self.restarts.pause_s):
                return  # stopping: the failed query stays as it is
            try:
                self.query = self._start()
            except Exception as again:  # noqa: BLE001 - counted, then raised when spent
                failure = again
                continue
            self.restarted += 1
            return


_NOT_THE_ERROR = ("File ", "^", "~", "SQLSTATE")
"""Lines of a Python traceback in Spark's message that are not the exception raised:
frames, the carets under them, and Spark's SQL state."""


def _reason(failure: BaseException) -> str:
    """The failure in a line: Spark's message without the query's plan, and of a
    Python traceback in it only the exception it ends with."""
    get_message = getattr(failure, "getMessage", None)
    text = str(get_message() if callable(get_message) else failure).strip()
    if not text:
        return type(failure).__name__
    head, traceback, rest = text.partition("Traceback (most recent call last):")
    if traceback:
        said = [line.strip() for line in rest.splitlines()]
        raised = [line for line in said if line and not line.startswith(_NOT_THE_ERROR)]
        head = f"{head.strip()} {raised[-1] if raised else ''}"
    else:
        head = head.splitlines()[0]
    return head.split(" SQLSTATE: ")[0].strip()
