"""Kafka transactions' calls, tried again while their error is a passing one.

Every transactional producer of redrive (the App's exactly-once hand-off, replay
jobs, the Spark pipeline's exactly-once output) calls init, begin, send-offsets,
commit and abort through :func:`retry_transactional`, with :data:`TIMEOUT_S`: a
coordinator that moves or loads answers with a retriable error for a while, which
is no reason to give up a transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import structlog
from confluent_kafka import KafkaException

log = structlog.get_logger("redrive.transactions")

TIMEOUT_S: Final = 30.0
"""How long one transactional call (init, offsets, commit, abort) may take."""

ATTEMPTS: Final = 10


def retry_transactional(call: Callable[[], object]) -> None:
    """A transactional call (init, offsets, commit, abort), again while the error is a
    passing one; a fatal or abortable error is raised at once."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            call()
            return
        except KafkaException as exc:
            error = exc.args[0]
            if not error.retriable() or attempt == ATTEMPTS:
                raise
            log.info("transactional call failed; trying again", error=error.str())
