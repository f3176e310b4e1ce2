"""Several whole services started by one `redrive serve` (setting `workers`).

One service process runs intake, its store writer and the scheduler under one
interpreter lock. Running whole services side by side lets one `redrive serve` use
more than one core's worth of Python: each takes a share of everything, the requests
topic's partitions split among their intake consumers and the due rows among their
row-locking claims, exactly as for `redrive serve` processes on several hosts.

This process is worker 0: it serves the API, the UI and the probes on the configured
port, and its /metrics adds up every worker's counters and histograms. The others are
children that listen on 127.0.0.1, on a port of their own that only worker 0 reads.
Each has its own static group membership (`<instance id>-w<n>`).

Invariant: the workers live and die together. A worker that ends stops the others,
and `redrive serve` exits non-zero naming it, so that the supervisor (systemd,
Kubernetes) restarts the whole; a worker whose parent is gone, even SIGKILLed and
even while the worker is still starting, stops itself within a second's notice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator
from typing import IO

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from redrive.errors import ConfigError
from redrive.service.config import ServiceSettings

log = structlog.get_logger("redrive.service.workers")

PORT_LINE = "redrive worker: metrics on port "
"""The first line a child writes on its stdout: worker 0 reads its metrics there."""

_SUMMED = frozenset({"counter", "histogram", "summary"})


def worker_settings(settings: ServiceSettings, index: int) -> ServiceSettings:
    """A child's settings: the same service, its HTTP on loopback at any free port,
    its own static membership."""
    base = settings.group_instance_id()
    return settings.model_copy(
        update={
            "workers": 1,
            "http_host": "127.0.0.1",
            "http_port": 0,
            # Empty keeps membership dynamic, as the parent's is without an id.
            "instance_id": f"{base}-w{index}" if base else "",
        }
    )


class Worker:
    """A child `redrive serve` worker, given its settings on stdin (not in its
    arguments or environment, where other users of the host could read a password)."""

    def __init__(self, settings: ServiceSettings, index: int) -> None:
        self.index = index
        self.port: int | None = None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "redrive.cli", "serve-worker", str(os.getpid()), str(index)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(worker_settings(settings, index).model_dump_json())
        self.proc.stdin.close()
        self._out = self.proc.stdout

    def wait_started(self) -> None:
        """Return once the worker serves its metrics; raise if it ended first."""
        for line in self._out:
            if line.startswith(PORT_LINE):
                self.port = int(line[len(PORT_LINE) :])
                threading.Thread(target=_forward, args=(self._out,), daemon=True).start()
                return
            sys.stdout.write(line)
        code = self.proc.wait()
        raise ConfigError(
            "workers (REDRIVE_WORKERS)",
            f"worker {self.index} ended before it started (exit code {code})",
            f"see its log lines above (worker={self.index}), or run fewer workers",
        )

    def metrics_text(self) -> str:
        if self.port is None:
            return ""
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=2) as response:
            return str(response.read().decode())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def _forward(stream: IO[str]) -> None:
    for line in stream:
        sys.stdout.write(line)


class Workers:
    """Worker 0's view of the others: started together, watched, stopped together."""

    def __init__(self, settings: ServiceSettings, count: int) -> None:
        self.settings = settings
        self.workers: list[Worker] = []
        self.count = count

    def start(self) -> None:
        self.workers = [Worker(self.settings, i) for i in range(1, self.count)]
        try:
            for worker in self.workers:
                worker.wait_started()
        except BaseException:
            self.stop()
            raise
        log.info("workers started", workers=self.count)

    def ended(self) -> tuple[int, int] | None:
        """(index, exit code) of a worker that has ended, if any."""
        for worker in self.workers:
            code = worker.proc.poll()
            if code is not None:
                return worker.index, code
        return None

    def stop(self, timeout: float = 30.0) -> None:
        for worker in self.workers:
            worker.stop()
        for worker in self.workers:
            code = worker.wait(timeout)
            if code not in (0, None):
                log.warning("worker ended badly", worker=worker.index, exit_code=code)

    def metrics_texts(self) -> list[str]:
        texts = []
        for worker in self.workers:
            try:
                texts.append(worker.metrics_text())
            except OSError as exc:  # a scrape still answers, without that worker
                log.warning("worker metrics unreadable", worker=worker.index, error=str(exc))
        return texts


class WorkersRegistry(CollectorRegistry):
    """Worker 0's metrics with the other workers' counters and histograms added in.

    Gauges are worker 0's own: the pending gauges are read from the shared store (the
    same in every worker) and readiness is worker 0's, which /readyz answers too.
    """

    def __init__(self, own: CollectorRegistry, workers: Workers) -> None:
        super().__init__(auto_describe=False)
        self._own = own
        self._workers = workers

    def collect(self) -> Iterator[Metric]:
        others = [
            family
            for text in self._workers.metrics_texts()
            for family in text_string_to_metric_families(text)
        ]
        yield from merged(self._own.collect(), others)


def merged(own: Iterable[Metric], others: Iterable[Metric]) -> Iterator[Metric]:
    """`own` families with the samples of `others` added to the summed kinds
    (counters, histograms, summaries), sample by sample (same name and labels). A
    `_created` sample keeps the earliest time; a sample only another has is added."""
    by_name = {family.name: family for family in own}
    for family in others:
        mine = by_name.get(family.name)
        if mine is None or mine.type not in _SUMMED or family.type != mine.type:
            continue
        index = {(s.name, tuple(sorted(s.labels.items()))): i for i, s in enumerate(mine.samples)}
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            at = index.get(key)
            if at is None:
                index[key] = len(mine.samples)
                mine.samples.append(sample)
                continue
            old = mine.samples[at]
            value = (
                min(old.value, sample.value)
                if sample.name.endswith("_created")
                else old.value + sample.value
            )
            mine.samples[at] = Sample(old.name, old.labels, value, old.timestamp, old.exemplar)
    yield from by_name.values()


def watch_parent(parent_pid: int, grace_s: float = 60.0) -> None:
    """In a child, from its first moment: once the parent is gone (it may have been
    SIGKILLed), SIGTERM this process, as a supervisor would. Before the service runs
    that ends it at once (whatever start-up was waiting for); once it runs, the service
    stops as on any SIGTERM. One that has not ended `grace_s` later exits regardless."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        log.warning("parent process gone; stopping", parent=parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        log.error("still running after its parent went; exiting", parent=parent_pid)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
