"""Pruning the history of delivered retries past `history_retention_days`.

Runs where the scheduler runs. Deletes go a bounded batch at a time, each in its own
short transaction, so that pruning a large backlog (after the retention was
shortened, say) never holds locks for long; several instances pruning at once only
share the work.
"""

from __future__ import annotations

import threading
from typing import Final

import structlog

from redrive.service.store import Store, StoreUnavailable

log = structlog.get_logger("redrive.service.history")

EVERY_S: Final = 60.0
BATCH: Final = 5_000


class HistoryPruner:
    def __init__(
        self,
        store: Store,
        retention_s: float,
        stop_event: threading.Event,
        *,
        every_s: float = EVERY_S,
        batch: int = BATCH,
    ) -> None:
        self._store = store
        self._retention_s = retention_s
        self._stop = stop_event
        self._every_s = every_s
        self._batch = batch

    def prune(self) -> int:
        """Delete everything past retention, a batch at a time; how many went."""
        total = 0
        while not self._stop.is_set():
            deleted = self._store.prune_history(older_than_s=self._retention_s, limit=self._batch)
            total += deleted
            if deleted < self._batch:
                break
        return total

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                if deleted := self.prune():
                    log.info("history pruned", deleted=deleted, retention_s=self._retention_s)
            except StoreUnavailable as exc:
                log.warning("history: store unavailable; pruning later", error=str(exc))
            self._stop.wait(self._every_s)
