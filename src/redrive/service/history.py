"""Pruning what the service keeps for a while: the history of delivered retries past
`history_retention_days`, the identities of accepted requests past
`repeat_window_days`.

Runs where the scheduler runs. Deletes go a bounded batch at a time, each in its own
short transaction, so that pruning a large backlog (after the retention was
shortened, say) never holds locks for long; several instances pruning at once only
share the work.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

import structlog

from redrive.clock import now_ms
from redrive.service.store import Store, StoreUnavailable

log = structlog.get_logger("redrive.service.history")

EVERY_S: Final = 60.0
BATCH: Final = 5_000


class Pruner:
    """Calls ``prune(limit)`` (how many it deleted) until a call deletes fewer than
    ``batch``, every ``every_s``."""

    def __init__(
        self,
        what: str,
        prune: Callable[[int], int],
        stop_event: threading.Event,
        *,
        every_s: float = EVERY_S,
        batch: int = BATCH,
    ) -> None:
        self._what = what
        self._prune = prune
        self._stop = stop_event
        self._every_s = every_s
        self._batch = batch

    def prune(self) -> int:
        """Delete everything due for it, a batch at a time; how many went."""
        total = 0
        while not self._stop.is_set():
            deleted = self._prune(self._batch)
            total += deleted
            if deleted < self._batch:
                break
        return total

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                if deleted := self.prune():
                    log.info("pruned", what=self._what, deleted=deleted)
            except StoreUnavailable as exc:
                log.warning("store unavailable; pruning later", what=self._what, error=str(exc))
            self._stop.wait(self._every_s)


def history_pruner(
    store: Store, retention_s: float, stop_event: threading.Event, *, batch: int = BATCH
) -> Pruner:
    """Delivered retries, once delivered over ``retention_s`` ago."""
    return Pruner(
        "history",
        lambda limit: store.prune_history(older_than_s=retention_s, limit=limit),
        stop_event,
        batch=batch,
    )


def identity_pruner(
    store: Store, window_s: float, stop_event: threading.Event, *, batch: int = BATCH
) -> Pruner:
    """Identities of accepted requests, ``window_s`` after their due time."""

    def prune(limit: int) -> int:
        return store.prune_accepted(before_ms=now_ms() - int(window_s * 1000), limit=limit)

    return Pruner("accepted identities", prune, stop_event, batch=batch)
