"""What every redrive consumer does around its loop, whatever it consumes with: stop
on request or signal, serve ``/metrics`` and ``/healthz`` while it runs, and judge its
own health (:mod:`redrive.consumer.loop_health`).

Invariant: the metrics port is bound before anything is consumed (a port in use stops
:meth:`Running.run` first) and closed once ``run`` returns or raises; what ``/healthz``
judges is written by the loop's thread only.
"""

from __future__ import annotations

import signal
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import FrameType

import structlog

from redrive.consumer.loop_health import loop_health
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.metrics_server import Health, MetricsServer, check_host, check_port

log = structlog.get_logger("redrive.consumer")


class Running(ABC):
    """A consumer's run: :meth:`run`, :meth:`stop`, health and metrics (see the module)."""

    def __init__(
        self, metrics: ConsumerMetrics, metrics_port: int | None, metrics_host: str
    ) -> None:
        self.metrics = metrics
        self.metrics_port = check_port(metrics_port)
        self.metrics_host = check_host(metrics_host)
        self._metrics_server: MetricsServer | None = None
        self._looping = False
        self._last_turn: float | None = None  # time.monotonic() the loop last polled
        self._loop_error: str | None = None
        self._stop = threading.Event()
        self.running = threading.Event()

    @property
    @abstractmethod
    def group(self) -> str: ...

    @abstractmethod
    def _check_ready(self) -> None:
        """Raise a ConfigError for what makes running pointless (no handler)."""

    @abstractmethod
    def _consume(self) -> None:
        """Open the clients and run :meth:`_loop` until stopped, closing them after."""

    @abstractmethod
    def _assigned(self) -> int:
        """Partitions held now, for ``/healthz`` (0 when the consumer cannot tell)."""

    @abstractmethod
    def _poll_limit_ms(self) -> float:
        """How long the loop may go without polling before Kafka drops the member."""

    def stop(self) -> None:
        """Ask the loop to finish its current record, commit and return (thread-safe)."""
        self._stop.set()

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Consume until :meth:`stop`, SIGTERM or SIGINT; commits what was dealt with.

        With ``metrics_port``, serves ``/metrics`` and ``/healthz`` from before the
        first poll until this returns (or raises): the port is closed by then."""
        self._check_ready()
        self._looping, self._last_turn, self._loop_error = False, None, None
        if self.metrics_port is not None:
            # Before Kafka: a port in use stops start-up before anything is consumed.
            self._metrics_server = MetricsServer(
                self.metrics.registry, self.health, self.metrics_host, self.metrics_port
            )
        try:
            if install_signal_handlers and threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, self._on_signal)
            self._consume()
        finally:
            if self._metrics_server is not None:
                self._metrics_server.close()
                self._metrics_server = None

    def _loop(self, turn: Callable[[], bool], between: Callable[[], None]) -> None:
        """Turn until stopped (``turn`` says whether it polled: health counts only
        those); ``between`` runs after each turn. A failure is kept for ``/healthz``."""
        self.running.set()
        self._last_turn = time.monotonic()
        self._looping = True
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                if turn():
                    self._last_turn = started
                between()
        except BaseException as exc:
            self._loop_error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._looping = False

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port/metrics`` while the metrics server runs, else None."""
        server = self._metrics_server
        return None if server is None else server.url("/metrics")

    @property
    def health_url(self) -> str | None:
        """``http://host:port/healthz`` while the metrics server runs, else None."""
        server = self._metrics_server
        return None if server is None else server.url("/healthz")

    def health(self, now: float | None = None) -> Health:
        """What ``/healthz`` answers (:mod:`redrive.consumer.loop_health`: the loop runs
        and polls). ``now`` is a ``time.monotonic()`` reading (tests pass a later one)."""
        return loop_health(
            group=self.group,
            assigned=self._assigned(),
            looping=self._looping,
            loop_error=self._loop_error,
            stopping=self._stop.is_set(),
            last_turn=self._last_turn,
            now=time.monotonic() if now is None else now,
            limit_ms=self._poll_limit_ms(),
        )

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        log.info("signal received; stopping", signal=signal.Signals(signum).name)
        self._stop.set()
