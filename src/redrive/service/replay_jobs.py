"""Bulk replays in the background: paced, resumable, cancellable, each letter sent once.

A bulk replay (by filter or by ids) is stored as a job (:mod:`.store.replay_jobs`)
and answered at once; a runner thread of a service with the scheduler role sends it.
One runner holds a job at a time (an advisory lock that PostgreSQL drops with the
runner's connection), so a job killed with its service is taken over at once by the
restarted service or by another instance.

A job's letters go out in batches, each batch one Kafka transaction of a producer
whose ``transactional.id`` is the job's own. The order of the writes makes a crash at
any point safe:

1. produce the batch in a transaction and flush: the broker has the records and
   says where each went (topic, partition, offset);
2. record the batch as `sending` with those places (refused if the job was cancelled
   meanwhile: the transaction is then aborted and nothing of the batch is sent);
3. commit the Kafka transaction;
4. record the batch as `sent`, and delete its letters unless the job keeps them.

A runner taking a job over first starts the job's producer, which fences the old
one and has the broker finish the old open transaction (aborted, unless it was
already committing). A `sending` batch is then looked up: a read-committed read at
its first record's place finds the record if the transaction committed, and skips
it if it aborted. Readers of the destination that read committed records
(librdkafka's default) so see every letter of a job exactly once.

A job may be scheduled (``start_at``): it is stored `scheduled`, and started (made
`running`, its ``started_at`` recorded) by whichever runner looks first once its
time has come; a runner sleeps until the earliest such time rather than a whole
poll, so a job starts within milliseconds of it, and a service restarted meanwhile
finds it in the store. Letters the loop guard quarantined are `skipped` from the
start (:mod:`.replay_guard`).

Pacing: the n-th letter of a runner's stint is not sent before n / rate seconds
after the stint began; a batch is a fifth of a second's worth, so a cancel takes
effect within about that.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import structlog
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from redrive.kafka import produce_patiently
from redrive.service.replay import Replayer, ReplayRefused, replayed_message
from redrive.service.store import DeadLetter, Placed, ReplayJob, ReplayJobStore, StoreUnavailable
from redrive.transactional import TIMEOUT_S, retry_transactional

log = structlog.get_logger("redrive.service.replay")

BATCH_SECONDS: Final = 0.2
"""A batch holds this many seconds' worth of letters at the job's rate."""
MAX_BATCH: Final = 1_000
POLL_SECONDS: Final = 1.0
"""How often a runner looks for a job (one created on this instance wakes it)."""


def batch_size(rate: float) -> int:
    return max(1, min(int(rate * BATCH_SECONDS), MAX_BATCH))


class Pace:
    """Not faster than `rate` letters a second since it began; waits by polling the
    producer (its delivery callbacks run meanwhile), never by sleeping blind."""

    def __init__(self, rate: float, producer: Producer) -> None:
        self._rate = rate
        self._producer = producer
        self._started = time.monotonic()
        self._count = 0

    def next(self) -> None:
        ahead = self._count / self._rate - (time.monotonic() - self._started)
        if ahead > 0:
            self._producer.poll(ahead)
        self._count += 1


@dataclass
class _Batch:
    """What the broker said of each letter of a batch."""

    placed: dict[int, Placed]
    refused: dict[int, str]


class ReplayJobRunner:
    """Runs the stored replay jobs, one at a time, until `stop_event` is set."""

    def __init__(
        self,
        jobs: ReplayJobStore,
        letters: Callable[[Sequence[int]], list[DeadLetter]],
        replayer: Replayer,
        *,
        kafka_config: dict[str, Any],
        producer_config: dict[str, Any],
        transactional_prefix: str,
        audit: Callable[..., None],
        stop_event: threading.Event,
    ) -> None:
        self._jobs = jobs
        self._letters = letters
        self._replayer = replayer
        self._kafka_config = kafka_config
        self._producer_config = producer_config
        self._prefix = transactional_prefix
        self._audit = audit
        self._stop = stop_event
        self._wake = threading.Event()
        self.healthy = True

    def wake(self) -> None:
        """A job was created: look now rather than at the next poll."""
        self._wake.set()

    def run(self) -> None:
        while not self._stop.is_set():
            wait = POLL_SECONDS
            try:
                for job_id in self._jobs.start_due():
                    log.info("scheduled replay job started", job=job_id)
                for job_id in self._jobs.unfinished():
                    with self._jobs.held(job_id) as mine:
                        if mine:
                            self._run(job_id)
                    if self._stop.is_set():
                        return
                # Woken at the next scheduled job's time, not at the next poll after it.
                if (next_start := self._jobs.next_start_s()) is not None:
                    wait = min(wait, max(next_start, 0.0))
                self.healthy = True
            except StoreUnavailable as exc:
                self.healthy = False
                log.warning("replay jobs: store unavailable; trying again", error=str(exc))
            self._wake.wait(wait)
            self._wake.clear()

    # ---------------------------------------------------------------- one job

    def _run(self, job_id: int) -> None:
        job = self._jobs.get(job_id)
        if job is None:
            return
        producer = Producer(
            {**self._producer_config, "transactional.id": f"{self._prefix}{job_id}"}
        )
        try:
            # Fences a previous runner of this job and completes its open transaction.
            retry_transactional(lambda: producer.init_transactions(TIMEOUT_S))
            self._settle_left_over(job_id)
            if job.state == "running":
                log.info("replay job running", job=job_id, total=job.total, rate=job.rate)
                self._send(job, producer)
        except KafkaException as exc:
            # Fenced (another runner took the job) or the broker refused the producer:
            # this stint ends; whoever holds the job next settles what was left open.
            log.error("replay job stopped by Kafka", job=job_id, error=str(exc.args[0]))
        finally:
            producer.flush(5)
        self._finished(job_id)

    def _send(self, job: ReplayJob, producer: Producer) -> None:
        job_id = job.id
        pace = Pace(job.rate, producer)
        size = batch_size(job.rate)
        while not self._stop.is_set():
            ids = self._jobs.next_todo(job_id, limit=size)
            if not ids:
                return
            rows = self._letters(ids)
            found = {r.id for r in rows}
            if gone := [i for i in ids if i not in found]:
                self._jobs.set_items(job_id, gone, "gone")
            if rows and not self._send_batch(job, producer, rows, pace):
                return  # cancelled

    def _send_batch(
        self, job: ReplayJob, producer: Producer, rows: list[DeadLetter], pace: Pace
    ) -> bool:
        """One batch in one transaction; False if the job was cancelled meanwhile. A
        letter the broker refuses is tried again alone, and marked failed if it is
        refused alone (its dead letter stays)."""
        job_id = job.id
        retry_transactional(producer.begin_transaction)
        batch = self._produce(job, producer, rows, pace)
        if batch.refused:
            retry_transactional(lambda: producer.abort_transaction(TIMEOUT_S))
            if len(rows) == 1:
                [(letter, error)] = batch.refused.items()
                log.warning("replay refused by the broker", job=job_id, letter=letter, error=error)
                self._jobs.set_items(job_id, [letter], "failed", error)
                return True
            return all(self._send_batch(job, producer, [row], pace) for row in rows)
        if not self._jobs.mark_sending(job_id, list(batch.placed.values())):
            retry_transactional(lambda: producer.abort_transaction(TIMEOUT_S))
            log.info("replay job cancelled; its open batch aborted", job=job_id)
            return False
        try:
            retry_transactional(lambda: producer.commit_transaction(TIMEOUT_S))
        except KafkaException as exc:
            if not exc.args[0].txn_requires_abort():
                raise
            retry_transactional(lambda: producer.abort_transaction(TIMEOUT_S))
            self._jobs.settle_sending(job_id, committed=False)  # to do again
            log.warning("replay batch aborted; sending it again", job=job_id, error=str(exc))
            return True
        self._jobs.settle_sending(job_id, committed=True)
        return True

    def _produce(
        self, job: ReplayJob, producer: Producer, rows: list[DeadLetter], pace: Pace
    ) -> _Batch:
        batch = _Batch({}, {})
        for row in rows:
            letter = row.id
            try:
                target = self._replayer.target_of(row, job.destination)
            except ReplayRefused as exc:  # its topic was deleted since the job began
                batch.refused[letter] = str(exc)
                continue
            value, headers = replayed_message(row)

            def done(err: KafkaError | None, msg: Message, letter: int = letter) -> None:
                if err is not None:
                    batch.refused[letter] = err.str()
                else:
                    batch.placed[letter] = Placed(
                        letter, str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0)
                    )

            pace.next()
            try:
                produce_patiently(
                    producer,
                    target.topic,
                    key=row.msg_key,
                    value=value,
                    headers=headers,
                    on_delivery=done,
                    partition=target.partition,
                )
            except KafkaException as exc:  # refused before sending (too large...)
                batch.refused[letter] = str(exc.args[0].str())
        producer.flush(TIMEOUT_S)
        for row in rows:
            letter = row.id
            if letter not in batch.placed and letter not in batch.refused:
                batch.refused[letter] = "not acknowledged by the broker in time"
        return batch

    # ---------------------------------------------------------------- after a crash

    def _settle_left_over(self, job_id: int) -> None:
        """Record what became of a batch whose runner stopped between recording it as
        `sending` and recording its outcome."""
        placed = self._jobs.sending(job_id)
        if not placed:
            return
        committed = self._committed(placed[0])
        self._jobs.settle_sending(job_id, committed=committed)
        log.info(
            "replay job taken over",
            job=job_id,
            open_batch=len(placed),
            batch_was="committed" if committed else "aborted",
        )

    def _committed(self, place: Placed) -> bool:
        """Whether the record at `place` is visible to a read-committed reader: its
        transaction committed. (Called after init_transactions, which has the broker
        finish that transaction first.)"""
        consumer = Consumer(
            {
                **self._kafka_config,
                "group.id": f"{self._prefix}check",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            }
        )
        try:
            consumer.assign([TopicPartition(place.topic, place.partition, place.offset)])
            deadline = time.monotonic() + TIMEOUT_S
            while time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                if (error := msg.error()) is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return False  # the end, without the record: aborted
                    continue
                return msg.offset() == place.offset
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, f"cannot read {place.topic}[{place.partition}]")
            )
        finally:
            consumer.close()

    # ---------------------------------------------------------------- the end

    def _finished(self, job_id: int) -> None:
        job = self._jobs.get(job_id)
        if job is None or job.state != "done":
            return
        sent = self._jobs.sent_ids(job_id)
        log.info("replay job done", job=job_id, sent=len(sent), failed=job.failed)
        self._audit(
            actor=job.actor,
            role=job.role,
            action="replay",
            ids=sent,
            count=len(sent),
            detail={
                "job": job_id,
                "destination": job.destination,
                "kept": job.keep,
                "failed": job.failed,
                "gone": job.gone,
                "skipped": job.skipped,
            },
        )


__all__ = ["ReplayJobRunner", "batch_size"]
