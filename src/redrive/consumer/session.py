"""One run of an App: its Kafka clients and running state, from the subscription to
the close.

The App registers routes and holds settings; a session is what :meth:`redrive.App.run`
makes of them: the consumer and the producer, the per-record pipeline
(:mod:`redrive.consumer.pipeline`), the offsets and pauses, the async lanes and
pending batches, the assignment (commits, transactions, rebalances). It is built in
one place, here, and lives as long as the run.

Invariant: what is taken is dealt with or handed back before the session closes: on
:meth:`finish` pending batches are handed to their handlers and async records get
their drain; :meth:`close` commits what was dealt with (a failure to is logged: those
records are handled again), then closes the consumer, the event loop and the
producer, in that order, whatever failed before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import structlog
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from redrive.client_logs import with_client_logs
from redrive.clock import now_ms
from redrive.consumer.assignment import Assignment, Callbacks, reset_offset
from redrive.consumer.async_records import AsyncRecords
from redrive.consumer.batches import Batches, BatchSettings
from redrive.consumer.bookkeeping import BookkeepingCheck
from redrive.consumer.brakes import Brakes
from redrive.consumer.clients import make_consumer, make_producer
from redrive.consumer.loop import flush_batches, poll_once
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.offsets import OffsetTracker
from redrive.consumer.outcomes import Outcomes
from redrive.consumer.pauses import PauseBook
from redrive.consumer.pipeline import Pipeline
from redrive.consumer.publisher import publisher_for
from redrive.consumer.refusals import return_check
from redrive.consumer.repeats import RecentIds
from redrive.consumer.routes import Kind, Route
from redrive.consumer.settings import AppSettings
from redrive.consumer.steps import KeyOrders, build_steps
from redrive.consumer.strategies.pause import Breakers
from redrive.consumer.topics import create_derived_topics
from redrive.consumer.transactions import Transactions, transactional_id
from redrive.membership import fatal_group_error
from redrive.rejoin import RejoinWatch

log = structlog.get_logger("redrive.consumer")

INSTANCE_ID_SETTING = "App(instance_id=...)"
SOONEST_COMMIT_S = 0.1
"""The shortest commit interval of a transactional App: it commits this soon after the
last commit when a hand-off in the open transaction is due, or a partition waits for
room in its kept lines (:mod:`redrive.consumer.kept_lines`)."""


class Session:
    """An App's running state (see the module); made by :meth:`open`."""

    def __init__(
        self,
        settings: AppSettings,
        routes: Mapping[str, Route],
        reads: dict[str, tuple[Route, Kind]],
        batched: Mapping[str, BatchSettings],
        metrics: ConsumerMetrics,
        stop: threading.Event,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.stop = stop
        # librdkafka's log lines go through structlog, not raw on stderr.
        config = with_client_logs({"bootstrap.servers": settings.bootstrap, **settings.kafka})
        admin = AdminClient(config)
        create_derived_topics(admin, list(routes.values()))
        self.offsets = OffsetTracker()
        self.consumer: Consumer = make_consumer(
            config, settings.consumer_kafka, settings.group, self._on_commit
        )
        self.producer = make_producer(
            admin,
            config,
            reads,
            settings.partitioner,
            transactional_id(settings.group, settings.instance_id)
            if settings.transactional
            else None,
        )
        publisher = self.publisher = publisher_for(
            self.producer, stop, settings.signing, settings.requests_topic
        )
        hooks = settings.hooks
        breakers = Breakers.of(
            ((r.topic, r.breaker) for r in routes.values()), metrics, hooks.on_breaker
        )
        bookkeeping = BookkeepingCheck(
            settings.signing, settings.returns.trust_unsigned, metrics.records
        )
        orders = self.orders = KeyOrders.of(
            settings.group,
            settings.requests_topic,
            publisher,
            metrics,
            routes.values(),
            batched,
            bookkeeping,
        )
        outcomes = Outcomes(
            settings.group,
            settings.requests_topic,
            publisher,
            metrics,
            hooks,
            RecentIds(settings.repeat_window, settings.unsigned_returns),
            settings.transactional,
            settings.returns,
            signing=settings.signing is not None,
        )
        self.brakes = Brakes.of(routes.values(), metrics)
        self.records = Pipeline(
            settings.group,
            reads,
            build_steps(routes.values(), orders, breakers, self.brakes),
            outcomes,
            breakers,
            self.brakes,
            orders.kept,
            return_check(settings.signing, settings.returns),
        )
        self.offsets.kept = orders.kept.offsets
        # What the last commit named done, until it is read again: named by every commit.
        self.offsets.named_before = self.records.done_before.unread
        self.pauses = PauseBook(self.consumer)
        self.batches = Batches(self.records, dict(batched)) if batched else None
        self.async_records = AsyncRecords.of(
            self.records, self.offsets, self.pauses, self.consumer, settings.polling.max_in_flight
        )
        self.assignment = Assignment(
            self.consumer,
            publisher,
            self.offsets,
            self.pauses,
            self.records,
            orders.all(),
            RejoinWatch(),
            config,
            list(reads),
            settings.group,
            reset_offset(dict(settings.consumer_config)),
            Transactions(self.producer, self.consumer) if settings.transactional else None,
            self.batches,
            self.async_records,
        )
        self._last_commit = time.monotonic()

    def subscribe(self, callbacks: Callbacks) -> None:
        self.assignment.subscribe(callbacks)

    def turn(self) -> bool:
        """One turn of the loop (:func:`redrive.consumer.loop.poll_once`): whether Kafka
        was polled."""
        polling = self.settings.polling
        return poll_once(
            self.consumer,
            self.records,
            self.offsets,
            self.pauses,
            self.metrics,
            polling.max_poll_records,
            polling.poll_timeout_s,
            self._fatal,
            self.batches,
            self.async_records,
        )

    def upkeep(self) -> None:
        """Between turns: commit when the interval is over, subscribe again when the
        group left the App out."""
        now = time.monotonic()
        if self._commit_due(now - self._last_commit):
            self.assignment.commit(asynchronous=True)
            self._last_commit = time.monotonic()
        if self.orders.kept.count():
            self.orders.send_overdue()
        if self.assignment.rejoin.due(now):
            self.assignment.subscribe_again()

    def _commit_due(self, since_s: float) -> bool:
        """Whether to commit, ``since_s`` after the last commit: each interval, and with
        transactions sooner when the open one holds a hand-off that is due (no reader
        sees it before the commit: a retry would come back up to an interval late) or
        a partition waits for room behind heads whose retries it holds."""
        if since_s >= self.settings.polling.commit_interval_s:
            return True
        if not self.settings.transactional or since_s < SOONEST_COMMIT_S:
            return False
        due = self.publisher.earliest_due_ms
        return bool(self.orders.kept.full) or (due is not None and due <= now_ms())

    def finish(self) -> None:
        """Stopping: what waits in a batch is handled; async records that run may end,
        the rest waits for the next owner."""
        if self.batches is not None:
            flush_batches(self.batches, self.records, self.offsets, self.metrics)
        if self.async_records is not None:
            self.async_records.drain(None)

    def close(self) -> None:
        try:
            self.assignment.commit(asynchronous=False)
        except Exception:
            log.exception("could not commit on shutdown; records will be handled again")
        finally:
            self.consumer.close()
            if self.async_records is not None:
                self.async_records.close()
            self.producer.close()

    def _fatal(self, error: KafkaError) -> Exception:
        instance_id = self.settings.consumer_kafka.get("group.instance.id")
        return fatal_group_error(error, self.settings.group, instance_id, INSTANCE_ID_SETTING)

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if err is None:
            self.offsets.committed([tp for tp in partitions if tp.error is None])
        elif err.code() != KafkaError._NO_OFFSET:
            log.warning("commit failed; records may be handled again", error=err.str())
