"""Batch handlers (``@app.batch_handler``): a handler called with a list of Messages.

**How a batch forms.** Records are accumulated across polls: the loop
(:mod:`redrive.consumer.loop`) takes each record of a batch route, in the order its
polls return them, into the route's pending batch (:meth:`Pending.take`), and hands
the batch to its handler once it holds ``max_records`` messages, or once its first
record has waited ``max_wait`` (:meth:`Batches.flush`). With ``max_wait=0`` (the
default) a batch is what one poll returned for the route, cut into chunks of at most
``max_records``. Why across polls: one poll returns what the client had fetched,
often a handful of records at low load, and the users of batch handlers write to a
database in bulk, where the cost is per batch: ``max_wait`` lets them trade latency
for fuller batches. The loop never sleeps for it: its poll timeout shrinks to the
next batch's deadline (:meth:`Batches.timeout`), as it does to a retry's due time.

**Offsets.** A record in a pending batch is not dealt with: its partition's position
moves only once its batch is through, every record handled or its retry or dead
letter handed off. A record dealt with before its handler (unreadable headers, a
value that does not deserialize: a dead letter at once) joins the pending batch as
done, so that no position passes a pending record. A partition revoked or lost
drops its pending records (uncommitted: its next owner reads them again); a graceful
stop hands the pending batches to their handlers first (``loop.flush_batches``).

**Failures.** A handler that raises :class:`~redrive.consumer.errors.BatchFailed`
names the records that failed, each with its error; the others are handled. Any
other exception fails every record of the batch with it. Each failed record goes
through :meth:`redrive.consumer.outcomes.Outcomes.failed`: the failure router
(``route.router``) and the strategy (``route.strategy``) of a single failed record, so
its retry or dead letter is the one a single-record handler raising that error would
have made, byte for byte but for the error's stack trace (which says where it was
raised). A BatchFailed that does not make sense (:func:`failures_of`)
fails the whole batch with :class:`~redrive.consumer.errors.InvalidBatchFailureError`,
logged as an error: never is a record silently counted as handled.

**Strategies.** ``topics`` and ``service``: the failed records leave to their tier
topic or the retry service, and come back, each on its own (in whatever batch it
then falls into) with ``attempt`` 2; the batch's other records are committed.
``blocking`` and ``pause`` retry in place, which in a batch would mean rewinding each
partition to its first failed record, so that every record after it on that
partition (handled or not) is handed to the handler again: refused at registration
(:func:`batch_settings`) until that is designed; the error says to use ``topics`` or
``service``.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from confluent_kafka import Message as KafkaMessage

from redrive.consumer.errors import BatchFailed, InvalidBatchFailureError
from redrive.consumer.handlers import is_async_callable, refuse_awaitable
from redrive.consumer.message import Message
from redrive.consumer.offsets import Partition
from redrive.consumer.outcomes import safe_repr
from redrive.consumer.pipeline import Pipeline
from redrive.consumer.routes import Route
from redrive.consumer.steps import Steps
from redrive.consumer.strategies import BY_NAME, RetryStrategy, Wait
from redrive.durations import to_ms
from redrive.errors import ConfigError
from redrive.policy import PolicyError

log = structlog.get_logger("redrive.consumer")

BATCH_STRATEGIES = tuple(name for name, plan in BY_NAME.items() if not plan.in_place)
"""The strategies a batch handler may use: those that hand a retry off, not those that
retry in place (see the module)."""
DEFAULT_MAX_RECORDS = 500
DEFAULT_MAX_WAIT_S = 0.0


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """How large a route's batches grow, and how long their first record waits."""

    max_records: int
    max_wait_s: float


def batch_settings(
    topic: str,
    fn: Callable[..., Any],
    strategy: RetryStrategy,
    max_records: object,
    max_wait: object,
) -> BatchSettings:
    """The settings of ``@app.batch_handler(topic, ...)`` calling ``fn``; ConfigError
    for a bad one (mypy refuses a strategy retrying in place already; this is for
    untyped callers).

    ``max_wait`` is seconds (int or float) or a duration (``"250ms"``, ``"2s"``)."""
    if strategy.ordering is not None:
        raise ConfigError(
            f"ordering for batch handler {topic!r}",
            "batch handlers do not keep key order through retries yet",
            "use a single-record handler",
        )
    if is_async_callable(fn):
        raise ConfigError(
            f"batch handler for {topic!r}",
            "async batch handlers are not supported yet",
            "use a plain def batch handler, or an async def single-record handler",
        )
    if strategy.in_place:
        raise ConfigError(
            f"strategy for batch handler {topic!r}",
            f"batch handlers do not support {strategy.name!r} yet: it retries in place, "
            "and a failed record of a batch would hold back, and hand again, every "
            "later record of its partition in the batch",
            f"use strategy {' or '.join(repr(s) for s in BATCH_STRATEGIES)}, or a "
            "single-record handler (@app.handler)",
        )
    if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 1:
        raise ConfigError(
            f"max_records for batch handler {topic!r}",
            f"{max_records!r} is not a whole number >= 1",
        )
    try:
        wait_ms = to_ms(max_wait, "max_wait")  # type: ignore[arg-type]  # checked there
    except (PolicyError, TypeError) as exc:
        raise ConfigError(
            f"max_wait for batch handler {topic!r}",
            str(exc),
            "give seconds (0.5) or a duration ('500ms'); 0 hands each poll's records at once",
        ) from None
    return BatchSettings(max_records, wait_ms / 1000)


def failures_of(failed: BatchFailed, messages: Sequence[Message]) -> dict[int, BaseException]:
    """The failed records a BatchFailed names, by index in ``messages``, with their
    errors; every record, with an :class:`InvalidBatchFailureError`, when it does not
    make sense (logged as an error: the handler has a bug)."""
    try:
        return resolve(failed, messages)
    except InvalidBatchFailureError as invalid:
        invalid.__cause__ = failed
        log.error(
            "batch handler raised an invalid BatchFailed; the whole batch fails",
            topic=messages[0].topic if messages else None,
            records=len(messages),
            problem=str(invalid),
        )
        return dict.fromkeys(range(len(messages)), invalid)


def resolve(failed: BatchFailed, messages: Sequence[Message]) -> dict[int, BaseException]:
    """The failed records a BatchFailed names, by index; InvalidBatchFailureError when
    it names none, a record twice, an index out of range (negative ones too), a message
    not in the batch (matched as itself, else by topic, partition and offset), or an
    error that is not an exception."""
    count = len(messages)
    if not failed.failures:
        raise InvalidBatchFailureError(
            "the batch handler raised BatchFailed naming no record: name the failed "
            "records, or return normally if every record was handled"
        )
    by_identity = {id(message): index for index, message in enumerate(messages)}
    by_place = {(m.topic, m.partition, m.offset): index for index, m in enumerate(messages)}
    found: dict[int, BaseException] = {}
    for item in failed.failures:
        try:
            key, error = item
        except (TypeError, ValueError):
            raise InvalidBatchFailureError(
                f"BatchFailed takes (index or message, exception) pairs, not {safe_repr(item)}"
            ) from None
        if isinstance(key, Message):
            index = by_identity.get(id(key))
            if index is None:
                index = by_place.get((key.topic, key.partition, key.offset))
            if index is None:
                raise InvalidBatchFailureError(
                    f"BatchFailed names message {key.topic}[{key.partition}]@{key.offset}, "
                    f"which is not in this batch of {count} record(s)"
                )
        elif isinstance(key, int) and not isinstance(key, bool):
            if not 0 <= key < count:
                raise InvalidBatchFailureError(
                    f"BatchFailed names index {key}, out of range: the batch has {count} "
                    f"record(s), indices 0 to {count - 1}"
                )
            index = key
        else:
            raise InvalidBatchFailureError(
                f"BatchFailed names {safe_repr(key)}: name a record by its index in the "
                "batch (an int) or by its Message"
            )
        if not isinstance(error, BaseException):
            raise InvalidBatchFailureError(
                f"BatchFailed gives record {index} the error {safe_repr(error)}, "
                "which is not an exception"
            )
        if index in found:
            raise InvalidBatchFailureError(f"BatchFailed names record {index} twice")
        found[index] = error
    return found


@dataclass(slots=True)
class Entry:
    """A record taken into a pending batch: ``message`` to hand the handler, or None
    for a record dealt with already (kept so its partition's position waits)."""

    record: KafkaMessage
    partition: Partition
    offset: int
    message: Message | None
    arrived: float
    """time.monotonic() of the poll that brought it."""


@dataclass(slots=True)
class Pending:
    """One batch route's pending batch."""

    records: Pipeline
    steps: Steps
    settings: BatchSettings
    entries: list[Entry] = field(default_factory=list)
    messages: int = 0

    def take(
        self, record: KafkaMessage, topic: str, partition: int, offset: int, arrived: float
    ) -> Wait | None:
        """Take a record into the batch: None once taken (its position moves when its
        batch is through), or the Wait of a tier record not due yet (not taken)."""
        records = self.records
        steps, kind = records.reads[topic]
        try:
            message = records.prepare(steps, kind, record, topic, partition, offset)
        except Exception as exc:  # noqa: BLE001 - no record may stop the consumer
            records.unprocessable(record, topic, partition, offset, exc)
            message = None
        if isinstance(message, Wait):
            return message
        self.entries.append(Entry(record, (topic, partition), offset, message, arrived))
        if message is not None:
            self.messages += 1
        return None

    def due(self, now: float) -> bool:
        """Whether the batch goes to its handler now: full, its first record has waited
        ``max_wait``, or it holds only records dealt with already."""
        if not self.entries:
            return False
        return (
            self.messages >= self.settings.max_records
            or self.messages == 0
            or now >= self.entries[0].arrived + self.settings.max_wait_s
        )

    def deadline(self) -> float | None:
        return self.entries[0].arrived + self.settings.max_wait_s if self.entries else None

    def cut(self) -> list[Entry]:
        """The next batch: the first entries up to ``max_records`` messages."""
        limit, taken, end = self.settings.max_records, 0, len(self.entries)
        for index, entry in enumerate(self.entries):
            if entry.message is not None:
                taken += 1
                if taken == limit:
                    end = index + 1
                    break
        chunk = self.entries[:end]
        del self.entries[:end]
        self.messages -= taken
        return chunk

    def forget(self, partitions: set[Partition]) -> None:
        kept = [entry for entry in self.entries if entry.partition not in partitions]
        self.entries = kept
        self.messages = sum(1 for entry in kept if entry.message is not None)


class Batches:
    """The pending batches of an App's batch routes (see the module)."""

    def __init__(self, records: Pipeline, settings: Mapping[str, BatchSettings]) -> None:
        self.records = records
        self.pending: dict[str, Pending] = {}
        """By route topic."""
        self.topics: dict[str, Pending] = {}
        """By every topic a batch route reads (its own, its tiers, its per-group topic)."""
        for name, (steps, _) in records.reads.items():
            route = steps.route
            chosen = settings.get(route.topic)
            if chosen is None:
                continue
            if route.topic not in self.pending:
                self.pending[route.topic] = Pending(records, steps, chosen)
            self.topics[name] = self.pending[route.topic]

    def timeout(self, timeout_s: float) -> float:
        """The poll timeout, shrunk to the next batch's deadline."""
        deadlines = [d for p in self.pending.values() if (d := p.deadline()) is not None]
        if not deadlines:
            return timeout_s
        return min(timeout_s, max(min(deadlines) - time.monotonic(), 0.0))

    def due(self, now: float) -> bool:
        return any(pending.due(now) for pending in self.pending.values())

    def flush(self, now: float, *, force: bool = False) -> dict[Partition, int]:
        """Hand each due batch (with ``force``, every pending one) to its handler and
        deal with its records; the last offset dealt with, by partition."""
        positions: dict[Partition, int] = {}
        for pending in self.pending.values():
            while pending.entries and (force or pending.due(now)):
                chunk = pending.cut()
                self._run(pending.steps, chunk)
                for entry in chunk:
                    if entry.offset > positions.get(entry.partition, -1):
                        positions[entry.partition] = entry.offset
        return positions

    def forget(self, partitions: set[Partition]) -> None:
        """Partitions leave this instance: their pending records go (uncommitted)."""
        for pending in self.pending.values():
            pending.forget(partitions)

    def _run(self, steps: Steps, chunk: list[Entry]) -> None:
        live = [entry for entry in chunk if entry.message is not None]
        if not live:
            return
        messages = [entry.message for entry in live if entry.message is not None]
        failures = self._call(steps.route, messages)
        records, outcomes = self.records, self.records.outcomes
        for index, entry in enumerate(live):
            error = failures.get(index)
            if error is None:
                continue
            topic, partition = entry.partition
            try:
                # Never a Wait: batch routes hand their retries off (BATCH_STRATEGIES).
                outcomes.failed(steps, messages[index], error)
            except Exception as exc:  # noqa: BLE001 - no record may stop the consumer
                records.unprocessable(entry.record, topic, partition, entry.offset, exc)
        outcomes.batch_succeeded(steps, messages, failures)

    def _call(self, route: Route, messages: list[Message]) -> dict[int, BaseException]:
        """Run the handler on a batch: which records failed, by index, with what."""
        try:
            result = route.handler(list(messages))  # its own list: the handler may change it
        except BatchFailed as failed:
            return failures_of(failed, messages)
        except Exception as exc:  # noqa: BLE001 - the handler's failure is what we handle
            log.info(
                "batch handler failed; every record of the batch fails",
                topic=route.topic,
                records=len(messages),
                error=safe_repr(exc),
            )
            return dict.fromkeys(range(len(messages)), exc)
        if result is not None and inspect.isawaitable(result):
            # An async function behind a plain one: its body never ran.
            return dict.fromkeys(range(len(messages)), refuse_awaitable(result))
        return {}
