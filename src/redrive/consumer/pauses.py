"""Partitions waiting for a due time, and the consumer-wide circuit breaker.

Nothing sleeps: a partition whose next record is not due yet is sought back to that
record and paused; the loop keeps polling (other partitions flow, the consumer stays
in its group however long the wait) and resumes the partition when it is due.

Invariant: while a circuit breaker holds (``all_until``), every assigned partition is
paused: those assigned at the time at once, those a rebalance assigns later at the
next turn of the loop (:meth:`PauseBook.resume_due`; a record fetched before that is
sought back by the loop, never handled). When it lifts, every partition resumes but
those whose own record is not due yet.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaException, TopicPartition

from redrive.consumer.offsets import Partition


class PauseBook:
    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer
        self._until: dict[Partition, int] = {}
        self._parked: dict[Partition, int] = {}
        """Waits of partitions taken away by a rebalance, kept in case they come back."""
        self.all_until: int | None = None
        """While set, every assigned partition waits (the pause strategy's breaker)."""
        self._all_paused: set[Partition] = set()
        """The partitions paused for the breaker (to pause those assigned since)."""

    def wait(self, partition: Partition, offset: int, until_ms: int) -> None:
        """Rewind `partition` to `offset` and hold it until `until_ms`."""
        self._parked.pop(partition, None)
        tp = TopicPartition(partition[0], partition[1], offset)
        self._consumer.seek(tp)
        self._consumer.pause([TopicPartition(partition[0], partition[1])])
        self._until[partition] = max(until_ms, self._until.get(partition, 0))

    def pause_all(self, until_ms: int) -> None:
        """Hold every assigned partition, and any assigned later, until ``until_ms``."""
        self.all_until = max(until_ms, self.all_until or 0)
        assignment = self._consumer.assignment()
        self._consumer.pause(assignment)
        self._all_paused = {(tp.topic, tp.partition) for tp in assignment}

    def _pause_newly_assigned(self) -> None:
        """A rebalance during a breaker: pause the partitions it brought."""
        new = [
            tp
            for tp in self._consumer.assignment()
            if (tp.topic, tp.partition) not in self._all_paused
        ]
        if new:
            self._consumer.pause(new)
            self._all_paused.update((tp.topic, tp.partition) for tp in new)

    @property
    def active(self) -> bool:
        """Whether any partition waits at all (the loop's cheap first check)."""
        return self.all_until is not None or bool(self._until) or bool(self._parked)

    def waiting(self, partition: Partition) -> bool:
        return self.all_until is not None or partition in self._until or partition in self._parked

    def until(self, partition: Partition) -> int:
        """When a waiting partition may go on."""
        return max(
            self._until.get(partition, 0), self._parked.get(partition, 0), self.all_until or 0
        )

    def resume_due(self, now_ms: int) -> None:
        """Resume what is due; a consumer-wide pause lifts all at once."""
        if self.all_until is not None:
            if now_ms < self.all_until:
                self._pause_newly_assigned()
                return
            self.all_until = None
            self._all_paused = set()
            held = set(self._until)
            self._consumer.resume(
                [
                    TopicPartition(t, p)
                    for t, p in ((tp.topic, tp.partition) for tp in self._consumer.assignment())
                    if (t, p) not in held
                ]
            )
        for partition in [p for p, until in self._parked.items() if until <= now_ms]:
            del self._parked[partition]
        due = [p for p, until in self._until.items() if until <= now_ms]
        if due:
            for partition in due:
                del self._until[partition]
            self._consumer.resume([TopicPartition(t, p) for t, p in due])

    def wake(self, partitions: Iterable[Partition]) -> None:
        """These partitions' waits are over before their time (what they waited for came
        early): resumed at the next :meth:`resume_due`."""
        for partition in partitions:
            if partition in self._until:
                self._until[partition] = 0

    def next_due_ms(self) -> int | None:
        times = list(self._until.values())
        if self.all_until is not None:
            times.append(self.all_until)
        return min(times, default=None)

    def release(self, partitions: set[Partition]) -> None:
        """Partitions are being revoked: resume them in the client, which would otherwise
        keep them paused if a rebalance gives them back, and park their due times, so a
        record fetched after they come back waits until due again (never early)."""
        held = [p for p in partitions if p in self._until]
        # Paused for a breaker: resumed too, and paused again if it comes back while
        # the breaker still holds (at the next turn).
        to_resume = held + [p for p in partitions if p in self._all_paused and p not in held]
        self._all_paused -= partitions
        if to_resume:
            with contextlib.suppress(KafkaException):
                self._consumer.resume([TopicPartition(t, p) for t, p in to_resume])
        for partition in held:
            self._parked[partition] = self._until.pop(partition)

    def parked(self) -> set[Partition]:
        return set(self._parked)

    def count(self) -> int:
        return len(self._until)
