"""Intake: from the requests topic into PostgreSQL, durably, then commit.

The loop reads a batch, classifies each request (a pending retry, or a dead letter
with its reason), inserts the whole batch in one idempotent transaction, and only
then commits the batch's offsets. The insert of one batch runs on a writer thread
while the loop reads and classifies the next (the database round trips overlap the
Python work); batches are stored and committed strictly in order. A crash anywhere
before the commit means the batch is read again, and its requests' identities,
accepted with them, make the re-insert drop them as repeats: nothing is lost and
nothing is stored twice. So is a request its sender wrote again (a consumer or a Spark
batch repeating itself after a crash), whenever it comes back within the identities'
window (``repeat_window_days``).

When PostgreSQL is down (or the broker cannot tell whether a destination exists),
intake keeps the batch, pauses its partitions and keeps polling (so it stays in its
consumer group without reading more), retries with backoff, and resumes once the
batch is stored. Nothing is dropped and nothing is skipped.

With ``ingest``, intake also reads dead-letter topics of other systems (and of
redrive's Apps): each record becomes a dead letter of its own
(:func:`redrive.service.ingest.ingest`), stored in the same batches with
the same guarantees (the unique index on its DLQ coordinates makes a record read
twice one dead letter; offsets are committed after the store commit).

Every commit names the store in its metadata, and no partition is read before the
group is known to read into this store (:mod:`redrive.service.store_guard`): a
service on another database with the same requests topic and group refuses it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from redrive.clock import now_ms
from redrive.kafka import consume_available
from redrive.membership import GroupConsumer, static_membership
from redrive.reasons import GIVEN_UP
from redrive.records import DeadLetterRecord, PendingRetry, Release
from redrive.rejoin import RejoinWatch
from redrive.requests import Incoming, IntakeRules, classify
from redrive.schedules import backoff_delay
from redrive.service.config import ServiceSettings
from redrive.service.dlq_mirror import DlqMirror, ingested
from redrive.service.ingest import ingest
from redrive.service.ingest.originals import Originals
from redrive.service.metrics import ServiceMetrics
from redrive.service.store import Store, Stored, StoreUnavailable
from redrive.service.store_guard import StoreGuard
from redrive.topic_admin import MetadataUnavailable

log = structlog.get_logger("redrive.intake")

INSTANCE_ID_SETTING = "instance_id (REDRIVE_INSTANCE_ID)"
# How long a revocation waits for the batch being stored, to commit it before the
# partitions go (an insert takes well under a second; the group waits for us longer).
REVOKE_WAIT_S = 10.0
# How soon a dead-letter topic created after start-up is found and read.
INGEST_DISCOVERY_MS = 5000
# How long a rejoin waits for the client it replaces to close (a wedged one never does).
REPLACED_CLOSE_WAIT_S = 5.0


def repeat_stage(record: PendingRetry | DeadLetterRecord | Release) -> str:
    """What a dropped repeat was, for its metric's label and its log line."""
    if isinstance(record, Release):
        return "release"
    if isinstance(record, DeadLetterRecord):
        return "dead_letter"
    return "behind" if record.order == "behind" else "retry"


def _names(partitions: list[TopicPartition]) -> list[str]:
    return [f"{tp.topic}[{tp.partition}]" for tp in partitions]


@dataclass
class _Batch:
    """One classified batch."""

    incoming: list[Incoming]
    pending: list[PendingRetry]
    dead: list[DeadLetterRecord]
    releases: list[Release]


class Intake:
    def __init__(
        self,
        settings: ServiceSettings,
        kafka_config: dict[str, Any],
        store: Store,
        rules: IntakeRules,
        metrics: ServiceMetrics,
        stop: threading.Event,
        guard: StoreGuard,
        on_scheduled: Callable[[int], None] = lambda due_ms: None,
        producer_config: dict[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.guard = guard  # checks the group before a partition is read; names the store
        self.rules = rules
        self.metrics = metrics
        self.stop = stop
        self.on_scheduled = on_scheduled
        self._kafka_config = kafka_config
        self.consumer = self._new_consumer()
        self.mirror = (
            DlqMirror(producer_config or kafka_config, settings.dlq_topic, metrics)
            if settings.mirror_dead_letters
            else None
        )
        self.originals = Originals(kafka_config)
        self.healthy = True
        self.rejoin = RejoinWatch()
        self._uncommitted: dict[tuple[str, int], int] = {}
        # The batch whose insert runs on the writer thread, until it is finished.
        self._in_flight: tuple[_Batch, Future[Stored]] | None = None

    def _new_consumer(self) -> GroupConsumer:
        """A client of intake's consumer group, not yet subscribed."""
        # Raises a fatal group error (another instance took this one's instance id)
        # instead of returning it as a message: the consumer is dead after one.
        return GroupConsumer(
            {
                **self._kafka_config,
                "group.id": self.settings.group_id,
                # A restarted instance takes its partitions back at once rather than
                # after the session timeout (see redrive.membership).
                **static_membership(self.settings.group_instance_id()),
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 50,
                # Read-ahead: 8 MB (librdkafka's default is 64 MB), refilled 10 ms after
                # intake made room. librdkafka waits fetch.queue.backoff.ms (1 s by
                # default) before fetching for a partition whose read-ahead was full,
                # so a busy worker ran dry once a second: under benchmark 2 that held
                # one worker to 11-14k requests/s with 8 MB, to 26k with 16 MB. With
                # 10 ms, 8 MB keeps it as fed as 32 MB did, for 50 MB less RSS.
                "queued.max.messages.kbytes": 8192,
                "fetch.queue.backoff.ms": 10,
                # A subscribed topic that does not exist yet (a dead-letter topic to
                # ingest, which its writer creates on first use) is read once a
                # metadata refresh finds it: librdkafka's default looks every five
                # minutes, so its first letters would wait that long.
                "topic.metadata.refresh.interval.ms": INGEST_DISCOVERY_MS,
                **self.settings.intake_kafka,
                # Not overridable: a request of a transaction aborted (or still open)
                # is not one, and Apps with transactional=True rely on that.
                "isolation.level": "read_committed",
            },
            setting=INSTANCE_ID_SETTING,
        )

    def run(self) -> None:
        """Consume until `stop` is set; then close the consumer (leaving the group)."""
        ingested = [source.topic for source in self.settings.ingest]
        self._subscribe()
        log.info(
            "intake started",
            topic=self.settings.requests_topic,
            group=self.settings.group_id,
            **({"ingests": ingested} if ingested else {}),
        )
        writer = ThreadPoolExecutor(1, thread_name_prefix="redrive-intake-store")
        try:
            while not self.stop.is_set():
                if self.rejoin.due(time.monotonic()) and not self._rejoin():
                    break  # stopping with a batch unstored: nothing after it may commit
                messages = consume_available(
                    self.consumer,
                    self.settings.intake_batch_size,
                    # While a batch is being stored, come back soon to commit it.
                    0.2 if self._in_flight is None else 0.01,
                    linger_s=self.settings.intake_linger_ms / 1000,
                )
                batch = self._classified(messages) if messages else None
                # The batch in flight is finished once stored, or at the latest before the
                # next one is handed to the writer (one at a time, committed in order).
                in_flight = self._in_flight
                due = in_flight is not None and (batch is not None or in_flight[1].done())
                if due and not self._finish_in_flight():
                    break  # stopping with a batch unstored: nothing after it may commit
                if batch is not None:
                    self._in_flight = batch, writer.submit(self._insert, batch)
            self._finish_in_flight()
        finally:
            writer.shutdown(wait=True)
            self._commit_last()
            self.consumer.close()
            self.originals.close()
            if self.mirror is not None:
                self.mirror.close()
            log.info("intake stopped")

    def _subscribe(self) -> None:
        ingested = [source.topic for source in self.settings.ingest]
        self.consumer.subscribe(
            [self.settings.requests_topic, *ingested],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _rejoin(self) -> bool:
        """No assignment since the partitions were lost (see redrive.rejoin): rejoin with
        a new client in place of the one that lost them. False if stopped first.

        Subscribing again on the same client is not enough: after a broker restart
        librdkafka can keep it out for good, its next join (and its close) waiting for
        offset commits queued on a coordinator connection that never comes back.

        Invariant: intake reads, commits and handles rebalances through one client,
        ``self.consumer``. The replaced client's batch is finished first (stored, and
        committed for the partitions that client still holds); then its positions are
        forgotten, nothing is committed through it and its callbacks are ignored. The
        new client reads each partition from the group's committed offset: what the old
        one fetched but intake did not store is read again, what was stored but not
        committed is read again and dropped as a repeat, and nothing is skipped.
        """
        log.warning(
            "no partitions assigned since they were lost; rejoining with a new client",
            group=self.settings.group_id,
            waited_s=self.rejoin.after_s,
        )
        if not self._finish_in_flight():
            return False
        self._uncommitted.clear()
        replaced, self.consumer = self.consumer, self._new_consumer()
        # Closing leaves the group, so the new client need not wait out a rebalance for
        # the old member; a wedged client never finishes, and is left to it.
        closing = threading.Thread(
            target=_close, args=(replaced,), name="redrive-intake-close", daemon=True
        )
        closing.start()
        closing.join(REPLACED_CLOSE_WAIT_S)
        if closing.is_alive():
            log.warning("the replaced client is still closing; left to it in the background")
        self._subscribe()
        return True

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:
            return  # a replaced client (see _rejoin)
        self.rejoin.assigned()
        self.guard.on_assign(consumer, partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions leave this instance: first commit the offsets of every stored
        batch, waiting a little for the one being stored. Otherwise the next owner reads
        those requests again, and any already delivered would be delivered twice (a
        pending one is skipped by the unique index, a delivered one is gone from it)."""
        if consumer is not self.consumer:
            return  # a replaced client, closing (see _rejoin)
        if self._in_flight is not None:
            stored = self._in_flight[1]
            wait([stored], timeout=REVOKE_WAIT_S)
            # Not stored yet (or the store is down): the loop keeps it, the next owner
            # reads it again.
            if stored.done() and stored.exception() is None:
                self._finish_in_flight()
        self._commit_last()
        self._hand_over(partitions)
        log.info("partitions revoked", partitions=_names(partitions))

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self.consumer:
            return  # a replaced client, closing (see _rejoin)
        self.rejoin.lost(time.monotonic())
        self._hand_over(partitions)
        log.warning(
            "partitions lost; their uncommitted requests will be read again by their next owner",
            partitions=_names(partitions),
        )

    def _hand_over(self, partitions: list[TopicPartition]) -> None:
        """Forget the positions of partitions this instance no longer owns: committing
        them later could move the next owner's committed offset back."""
        for tp in partitions:
            self._uncommitted.pop((tp.topic, tp.partition), None)

    def _finish_in_flight(self) -> bool:
        """Finish the batch being stored, if any (see `_finish`)."""
        in_flight, self._in_flight = self._in_flight, None
        return in_flight is None or self._finish(*in_flight)

    def _classified(self, messages: Sequence[Message]) -> _Batch | None:
        """The batch's requests, each a pending retry or a dead letter; None if empty (or
        stopping before the broker could answer metadata: the batch is read again)."""
        incoming = []
        for msg in messages:
            error = msg.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error", error=str(error))
                continue
            incoming.append(Incoming.from_message(msg))
        if not incoming:
            return None
        requests = self.settings.requests_topic
        self.metrics.received.inc(sum(1 for item in incoming if item.topic == requests))
        classified = self._classify_waiting(incoming)
        if classified is None:
            return None
        return _Batch(incoming, *classified)

    def _insert(self, batch: _Batch) -> Stored:
        """On the writer thread: store the batch, then wake the scheduler if it is due."""
        parts = batch.pending, batch.dead, batch.releases
        stored = self.store.insert_batch(*parts, now_ms=now_ms(), read=batch.incoming)
        if batch.pending:
            self.on_scheduled(min(p.due_ms for p in batch.pending))
        if stored.advanced:  # the next of a released key's queue is due now
            self.on_scheduled(now_ms())
        return stored

    def _finish(self, batch: _Batch, insert: Future[Stored]) -> bool:
        """Once the batch's insert ended: retry it while the store is down, then commit.
        False if stopped before the batch was stored."""
        try:
            stored = insert.result()
        except StoreUnavailable as exc:
            self._store_failed(exc, batch, attempt=1)
            waited = self._store_waiting(batch)
            if waited is None:
                return False  # stopping before the batch was stored: it will be read again
            stored = waited
        dead = stored.letters(batch.dead)  # forgeries' too: counted, logged, mirrored
        self._stored(stored, dead)
        if self.mirror is not None:
            self.mirror.copy(dead)
        self._commit(batch.incoming)
        for repeat in stored.repeats:
            assert repeat.request is not None  # only requests (read, with identities) repeat
            assert repeat.identity is not None
            log.info(
                "repeat dropped: its request was accepted before",
                topic=repeat.request.topic,
                partition=repeat.request.partition,
                offset=repeat.request.offset,
                stage=repeat_stage(repeat),
                identity=repeat.identity.hex(),
            )
        for letter in dead:
            assert letter.request is not None
            # A consumer's own dead letter is business as usual, and so is one ingested
            # from a dead-letter topic; anything else was refused.
            sent = letter.reason_code in GIVEN_UP or ingested(letter)
            (log.info if sent else log.warning)(
                "dead letter stored" if sent else "request refused",
                topic=letter.request.topic,
                partition=letter.request.partition,
                offset=letter.request.offset,
                destination=letter.topic,
                reason=letter.reason,
            )
        return True

    def _classify_waiting(
        self, incoming: list[Incoming]
    ) -> tuple[list[PendingRetry], list[DeadLetterRecord], list[Release]] | None:
        """Classify the batch; while the broker cannot answer metadata, wait paused.
        None if stopped first."""
        attempt = 0
        while True:
            try:
                now = now_ms()
                pending: list[PendingRetry] = []
                dead: list[DeadLetterRecord] = []
                releases: list[Release] = []
                requests = self.settings.requests_topic
                for item in incoming:
                    if item.topic != requests:  # a dead-letter topic intake ingests
                        read_as = self.settings.ingest_format(item.topic) or "auto"
                        dead.append(self.originals.complete(ingest(item, read_as)))
                        continue
                    result = classify(item, self.rules, now)
                    if isinstance(result, PendingRetry):
                        pending.append(result)
                    elif isinstance(result, Release):
                        releases.append(result)
                    else:
                        dead.append(result)
                return pending, dead, releases
            except MetadataUnavailable as exc:
                attempt += 1
                log.warning(
                    "topic metadata unavailable; intake waits", error=str(exc), attempt=attempt
                )
                if not self._pause_for(attempt):
                    return None

    def _stored(self, stored: Stored, dead: list[DeadLetterRecord]) -> None:
        """Count a stored batch: its new pending rows, its repeats, the letters it stored."""
        self.healthy = True
        self.metrics.scheduled.inc(stored.inserted)
        for repeat in stored.repeats:
            self.metrics.repeats.labels(repeat_stage(repeat)).inc()
        for letter in stored.read_again:
            self.metrics.ingested_again.labels(letter.source.removeprefix("ingest:")).inc()
        for letter in dead:
            if ingested(letter):
                self.metrics.ingested.labels(letter.source.removeprefix("ingest:")).inc()
            else:
                self.metrics.invalid.labels(letter.reason_code).inc()
            self.metrics.dead_lettered.labels(letter.reason_code).inc()

    def _store_failed(self, exc: StoreUnavailable, batch: _Batch, attempt: int) -> None:
        self.healthy = False
        self.metrics.store_errors.labels("insert").inc()
        log.warning(
            "store unavailable; intake paused, batch kept",
            error=str(exc),
            batch=len(batch.pending) + len(batch.dead),
            attempt=attempt,
        )

    def _store_waiting(self, batch: _Batch) -> Stored | None:
        """Insert a batch whose first insert failed; while PostgreSQL is down, wait paused.
        None if stopped first."""
        attempt = 1
        while True:
            if not self._pause_for(attempt):
                return None
            try:
                stored = self._insert(batch)
            except StoreUnavailable as exc:
                attempt += 1
                self._store_failed(exc, batch, attempt)
                continue
            log.info("store reachable again; intake resumes", after_attempts=attempt)
            return stored

    def _pause_for(self, attempt: int) -> bool:
        """Back off (0.2 s doubling to the configured maximum) without reading more
        messages, but keep polling so the consumer stays in its group. False if stopped."""
        delay = backoff_delay(attempt, 0.2, self.settings.store_retry_max_seconds)
        assignment = self.consumer.assignment()
        self.consumer.pause(assignment)
        try:
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline:
                if self.stop.is_set():
                    return False
                # Paused partitions return no messages; poll serves rebalances and keeps
                # max.poll.interval.ms satisfied during a long outage.
                msg = self.consumer.poll(min(0.1, max(deadline - time.monotonic(), 0)))
                if msg is not None and msg.error() is None:  # from a newly assigned partition
                    item = Incoming.from_message(msg)
                    self.consumer.seek(TopicPartition(item.topic, item.partition, item.offset))
            return True
        finally:
            self.consumer.resume(self.consumer.assignment())

    def _commit(self, incoming: list[Incoming]) -> None:
        """Commit past the batch, asynchronously: the batch is already durable, so a lost
        commit only makes the requests be read again, and the idempotent insert ignores
        them. (The last positions are committed synchronously when intake stops.)"""
        # A batch holds each partition's records in offset order (as librdkafka hands
        # them over), so the last of a partition is its highest. (Were it not, the
        # commit would only be lower: what follows is read again, and skipped as stored.)
        highest = {(item.topic, item.partition): item.offset for item in incoming}
        # A partition revoked while its batch was stored is the next owner's to commit.
        owned = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
        offsets = [
            TopicPartition(t, p, o + 1, metadata=self.guard.mark)
            for (t, p), o in highest.items()
            if (t, p) in owned
        ]
        if not offsets:
            return
        self._uncommitted.update({(tp.topic, tp.partition): tp.offset for tp in offsets})
        try:
            self.consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as exc:
            log.warning("offset commit failed; requests will be read again", error=str(exc))

    def _commit_last(self) -> None:
        if not self._uncommitted:
            return
        mark = self.guard.mark  # every commit names the store (see store_guard)
        offsets = [
            TopicPartition(t, p, o, metadata=mark) for (t, p), o in self._uncommitted.items()
        ]
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # A rebalance took the partitions away: the new owner reads these requests
            # again and the idempotent insert ignores them. Nothing is lost.
            log.warning("offset commit failed; requests will be read again", error=str(exc))


def _close(consumer: Consumer) -> None:
    """Close a client intake replaced, on a thread of its own (it may never return)."""
    try:
        consumer.close()
    except Exception as exc:  # noqa: BLE001 - a client thrown away may fail to close
        log.warning("the replaced client failed to close", error=str(exc))
