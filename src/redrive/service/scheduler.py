"""Scheduler: delivers each pending retry to its destination when it is due.

One loop, the whole idea:

1. Claim the due rows nobody holds, in due order, with `FOR UPDATE SKIP LOCKED`
   (`Store.claim_due`): the rows stay locked in a transaction held open until they
   are settled. Several instances on one database thus share the work, and the rows
   of an instance that crashed are free again as soon as its connection drops (or,
   if it hangs, once PostgreSQL ends its idle transaction after `lease_seconds`).
2. Produce each to its destination with its original key, its partition when the
   request named one, and its headers exactly as they were received (so the consumer
   sees its attempt count and original coordinates), the request's signature with
   them: its reader verifies what it believes of them. The records of a key's queue,
   which a claim marks with their run (``redrive-run``), are signed again with the
   key of the service's that signed their request, when it verifies
   (:func:`sign_again`).
3. Wait for the broker's acknowledgements; only then delete the rows, in the claim's
   transaction. A crash between acknowledgement and commit delivers a message twice,
   never zero times.
4. Sleep until the next due time rather than on a poll interval,
   and be woken early when an earlier request arrives: directly by intake in this
   process, and through PostgreSQL LISTEN/NOTIFY from intakes of other instances.

A row whose deadline passed while it waited goes to the dead letters instead; a row
the broker refuses for good (too large, topic gone, not authorized) too. A delivery
failing for a passing reason is given back and tried again a second later.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from redrive.clock import now_ms
from redrive.kafka import BATCH_WIDE_REFUSALS, produce_patiently
from redrive.reasons import DeadLetterReason
from redrive.returns import signature_of
from redrive.schedules import backoff_delay
from redrive.service.config import ServiceSettings
from redrive.service.metrics import ServiceMetrics
from redrive.service.store import ClaimedRetry, Settlement, Store, StoreUnavailable
from redrive.signing import KeyRing, Verdict

log = structlog.get_logger("redrive.scheduler")

MAX_IDLE_S = 5.0  # a safety net: re-check the store at least this often
TRANSIENT_RETRY_MS = 1_000

# Errors after which producing the same message again cannot succeed.
_PERMANENT = {
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.INVALID_RECORD,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.TOPIC_EXCEPTION,
}
# Of those, the ones a broker returns for a whole batch of records.
_BATCH_WIDE = BATCH_WIDE_REFUSALS


def sign_again(rows: Sequence[ClaimedRetry], keys: KeyRing) -> None:
    """Sign again each row whose redrive headers its claim changed (a run's mark), so
    that its reader can verify it as it verifies any delivery: with the key of ours its
    request was signed with, which its sender (its reader) holds, whatever the service
    signs with first during a rotation. Only a row whose request's signature verifies
    with that key over the headers it was stored with: another (a request accepted
    unsigned, when signatures were not required; one signed with a key removed since)
    goes as it is, since the service vouches for nothing no holder of its keys wrote."""
    signers: dict[str, KeyRing] = {}
    for row in rows:
        stored = row.as_stored
        if stored is None:
            continue
        signature = signature_of(stored)
        if signature is None:
            continue  # unsigned: nothing to verify, nothing vouched for
        if keys.verify(stored, row.key, row.value, signature).verdict is not Verdict.VALID:
            continue
        key_id = signature.split(":")[1]  # (a valid one reads v1:<key id>:<MAC>)
        signer = signers.get(key_id)
        if signer is None:
            key = next(key for key in keys.keys if key.id == key_id)
            signer = signers[key_id] = KeyRing((key,))
        row.headers = signer.signed(row.headers, row.key, row.value)


@dataclass
class _Outcome:
    acked: list[ClaimedRetry] = field(default_factory=list)
    permanent: list[tuple[ClaimedRetry, KafkaError]] = field(default_factory=list)
    transient: list[tuple[ClaimedRetry, KafkaError | None]] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        settings: ServiceSettings,
        kafka_config: dict[str, Any],
        store: Store,
        metrics: ServiceMetrics,
        stop: threading.Event,
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.stop = stop
        self.owner = f"{settings.group_id}-{uuid.uuid4().hex[:12]}"
        self._producer_config = {
            **kafka_config,
            "linger.ms": 2,
            **settings.scheduler_kafka,
            # What the delivery guarantee rests on, which settings may not change:
            "enable.idempotence": True,  # acks=all, ordered, no duplicates from retries
            # A delivery report only for a record that failed: a flush that ends
            # with nothing left queued acknowledged every other one (`_produce`),
            # so the success path builds no report message and calls no Python.
            "delivery.report.only.error": True,
        }
        self.producer = Producer(self._producer_config)
        self._keys = settings.key_ring()
        self._wakeup = threading.Event()
        self._planned_wake_ms: float = math.inf
        self.healthy = True

    def wake(self, due_ms: int) -> None:
        """Something due at `due_ms` was stored: wake up now if that is earlier than planned.

        Thread-safe; called by intake in this process and by the NOTIFY listener.
        While the loop is awake the planned time is +inf, so any call during that
        window makes the next sleep return at once (the loop then re-reads the store).
        """
        if due_ms < self._planned_wake_ms:
            self._wakeup.set()

    def run(self) -> None:
        log.info("scheduler started", owner=self.owner)
        failures = 0
        try:
            while not self.stop.is_set():
                self._wakeup.clear()
                self._planned_wake_ms = math.inf
                try:
                    if self._deliver_due():
                        failures = 0
                        continue  # there may be more due right now
                    now = now_ms()
                    next_ms = self.store.next_wake_ms()
                    failures = 0
                    self.healthy = True
                except StoreUnavailable as exc:
                    failures += 1
                    self.healthy = False
                    self.metrics.store_errors.labels("schedule").inc()
                    backoff = backoff_delay(failures, 0.2, self.settings.store_retry_max_seconds)
                    log.warning(
                        "store unavailable; scheduler waits",
                        error=str(exc),
                        retry_in_s=round(backoff, 2),
                    )
                    self.stop.wait(backoff)
                    continue
                sleep_s = MAX_IDLE_S if next_ms is None else (next_ms - now) / 1000
                sleep_s = min(max(sleep_s, 0.0), MAX_IDLE_S)
                self._planned_wake_ms = now + sleep_s * 1000
                if sleep_s > 0:
                    self._wakeup.wait(sleep_s)
        finally:
            self.producer.flush(30)
            self.producer.close()
            log.info("scheduler stopped", owner=self.owner)

    def _deliver_due(self) -> bool:
        """Claim and deliver one batch of due rows. False if nothing was due."""
        timeout_s = self.settings.lease_seconds * 0.8  # settle before the claim times out
        outcome: _Outcome | None = None
        expired: list[ClaimedRetry] = []
        try:
            with self.store.claim_due(
                now_ms=now_ms(), limit=self.settings.scheduler_batch_size
            ) as claim:
                if not claim.rows:
                    return False
                if self._keys is not None:
                    sign_again(claim.rows, self._keys)
                now = now_ms()
                expired = [
                    r for r in claim.rows if r.deadline_ms is not None and r.deadline_ms < now
                ]
                deliverable = [r for r in claim.rows if r not in expired] if expired else claim.rows
                outcome = self._deliver(deliverable, timeout_s=timeout_s)
                claim.settle(self._settlement(outcome, expired))
        except StoreUnavailable:
            if outcome is None:
                raise  # nothing was produced: the claim simply did not happen
            # Produced, but the claim's commit failed: record again, in fresh transactions.
            self._settle_retrying(self._settlement(outcome, expired))
        self._report(outcome, expired)
        return True

    def _deliver(self, rows: list[ClaimedRetry], timeout_s: float) -> _Outcome:
        """Produce the rows; a row refused with a batch-wide error is produced again on
        its own, so that one oversized message does not take its batch-mates with it
        to the dead letters."""
        outcome = self._produce(rows, timeout_s)
        self._replace_if_fatal(outcome)
        suspects = [row for row, err in outcome.permanent if err.code() in _BATCH_WIDE]
        if len(suspects) < 2:
            return outcome
        outcome.permanent = [(r, e) for r, e in outcome.permanent if e.code() not in _BATCH_WIDE]
        for row in suspects:
            alone = self._produce([row], timeout_s)
            outcome.acked += alone.acked
            outcome.permanent += alone.permanent
            outcome.transient += alone.transient
        return outcome

    def _produce(self, rows: list[ClaimedRetry], timeout_s: float) -> _Outcome:
        """Produce the rows and wait for the broker. Only a failed record is reported
        (``delivery.report.only.error``), so once nothing is left queued every record
        not reported was acknowledged. If some are still queued at the timeout, the
        ones not reported are given back as passing failures: one of them may then be
        delivered twice, never lost."""
        outcome = _Outcome()
        failed: set[int] = set()

        def refused(row: ClaimedRetry, err: KafkaError) -> None:
            failed.add(row.id)
            if err.code() in _PERMANENT:
                outcome.permanent.append((row, err))
            else:
                outcome.transient.append((row, err))

        def on_failure(row: ClaimedRetry) -> Callable[[KafkaError | None, Message], None]:
            def callback(err: KafkaError | None, msg: Message) -> None:
                if err is not None:  # (a success is not reported: only.error)
                    refused(row, err)

            return callback

        for row in rows:
            try:
                produce_patiently(
                    self.producer,
                    row.destination,
                    key=row.key,
                    value=row.value,
                    headers=row.headers,
                    on_delivery=on_failure(row),
                    partition=row.partition,
                )
            except KafkaException as exc:  # refused before sending (e.g. too large)
                refused(row, exc.args[0])
        remaining = self.producer.flush(timeout_s)
        unreported = [row for row in rows if row.id not in failed] if failed else rows
        if remaining:
            outcome.transient += [(row, None) for row in unreported]
            return outcome
        outcome.acked = unreported
        self.metrics.lateness.observe_batch(now_ms(), [row.due_ms for row in unreported])
        return outcome

    def _replace_if_fatal(self, outcome: _Outcome) -> None:
        """An idempotent producer with a fatal error (its sequence lost with the
        broker's state, say) fails every record from then on: the rows it failed are
        due again soon anyway, so a new producer takes over, and they go."""
        fatal = [
            err
            for _, err in outcome.transient
            if err is not None and (err.fatal() or err.code() == KafkaError._FATAL)
        ]
        if not fatal:
            return
        log.error("delivery producer failed for good; replaced", error=fatal[0].str())
        self.metrics.delivery_errors.labels("producer_replaced").inc()
        old, self.producer = self.producer, Producer(self._producer_config)
        old.purge()
        old.close()

    @staticmethod
    def _settlement(outcome: _Outcome, expired: list[ClaimedRetry]) -> Settlement:
        """The outcome as the store records it; a passing failure is tried again soon."""
        dead = [
            (
                r.id,
                DeadLetterReason.DELIVERY_FAILED,
                f"delivery to {r.destination!r} failed for good: {err.str()}",
            )
            for r, err in outcome.permanent
        ]
        dead += [
            (
                r.id,
                DeadLetterReason.DEADLINE_PASSED,
                f"deadline passed while pending: redrive-deadline {r.deadline_ms}, due {r.due_ms}",
            )
            for r in expired
        ]
        return Settlement(
            delivered=[r.id for r in outcome.acked if r.order_queue is None],
            kept=[r.id for r in outcome.acked if r.order_queue is not None],
            dead=dead,
            retry=[r.id for r, _ in outcome.transient],
            retry_at_ms=now_ms() + TRANSIENT_RETRY_MS,
        )

    def _settle_retrying(self, settlement: Settlement) -> None:
        """Record an outcome whose claim could not commit; wait out a store outage. Until
        it is recorded the rows are due again, so a delivery may repeat: never be lost."""
        failures = 0
        while True:
            try:
                self.store.settle(replace(settlement, retry_at_ms=now_ms() + TRANSIENT_RETRY_MS))
                return
            except StoreUnavailable as exc:
                failures += 1
                self.metrics.store_errors.labels("settle").inc()
                if self.stop.is_set() and failures > 3:
                    log.warning(
                        "stopping with deliveries unrecorded; they will repeat",
                        rows=len(settlement.delivered),
                    )
                    return
                self.stop.wait(
                    backoff_delay(failures + 1, 0.2, self.settings.store_retry_max_seconds)
                )
                log.warning("store unavailable while recording deliveries", error=str(exc))

    def _report(self, outcome: _Outcome, expired: list[ClaimedRetry]) -> None:
        """Metrics and logs of one settled batch."""
        published: dict[str, int] = {}
        for row in outcome.acked:
            published[row.destination] = published.get(row.destination, 0) + 1
        for destination, count in published.items():
            self.metrics.published.labels(destination).inc(count)
        for row, err in outcome.permanent:
            self.metrics.dead_lettered.labels(DeadLetterReason.DELIVERY_FAILED).inc()
            self.metrics.delivery_errors.labels(err.name()).inc()
            log.error(
                "delivery failed for good; dead-lettered",
                destination=row.destination,
                partition=row.partition,
                row_id=row.id,
                error=err.str(),
            )
        for row in expired:
            self.metrics.dead_lettered.labels(DeadLetterReason.DEADLINE_PASSED).inc()
            log.warning(
                "deadline passed while pending; dead-lettered",
                destination=row.destination,
                row_id=row.id,
            )
        for row, maybe_err in outcome.transient:
            name = maybe_err.name() if maybe_err is not None else "timeout"
            self.metrics.delivery_errors.labels(name).inc()
            log.warning(
                "delivery failed; will retry",
                destination=row.destination,
                row_id=row.id,
                error=name,
            )
