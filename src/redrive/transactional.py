"""Kafka transactions' calls, tried again while their error is a passing one.

Every transactional producer of redrive (the App's exactly-once hand-off, replay
jobs, the Spark pipeline's exactly-once output) calls init, begin, send-offsets,
commit and abort through :func:`retry_transactional`, with :data:`TIMEOUT_S`: a
coordinator that moves or loads answers with a retriable error for a while, which
is no reason to give up a transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

import structlog
from confluent_kafka import KafkaException

log = structlog.get_logger("redrive.transactions")

TIMEOUT_S: Final = 30.0
"""How long one transactional call (init, offsets, commit, abort) may take."""

ATTEMPTS: Final = 10

T = TypeVar("T")


def retry_transactional(call: Callable[[], T]) -> T:
    """A transactional call (init, offsets, commit, abort, a committed offset read with
    require_stable), again while the error is a passing one; a fatal or abortable
    error is raised at once. Returns what the call returned."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return call()
        except KafkaException as exc:
            error = exc.args[0]
            if not error.retriable() or attempt == ATTEMPTS:
                raise
            log.info("transactional call failed; trying again", error=error.str())
    raise AssertionError("unreachable: the last attempt returns or raises")
