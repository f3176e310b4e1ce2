"""Partitions waiting for a due time, and the consumer-wide circuit breaker.

Nothing sleeps: a partition whose next record is not due yet is sought back to that
record and paused; the loop keeps polling (other partitions flow, the consumer stays
in its group however long the wait) and resumes the partition when it is due.
"""

from __future__ import annotations

import contextlib

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

    def wait(self, partition: Partition, offset: int, until_ms: int) -> None:
        """Rewind `partition` to `offset` and hold it until `until_ms`."""
        self._parked.pop(partition, None)
        tp = TopicPartition(partition[0], partition[1], offset)
        self._consumer.seek(tp)
        self._consumer.pause([TopicPartition(partition[0], partition[1])])
        self._until[partition] = max(until_ms, self._until.get(partition, 0))

    def pause_all(self, until_ms: int) -> None:
        self.all_until = max(until_ms, self.all_until or 0)
        self._consumer.pause(self._consumer.assignment())

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
                return
            self.all_until = None
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
        if held:
            with contextlib.suppress(KafkaException):
                self._consumer.resume([TopicPartition(t, p) for t, p in held])
        for partition in held:
            self._parked[partition] = self._until.pop(partition)

    def parked(self) -> set[Partition]:
        return set(self._parked)

    def count(self) -> int:
        return len(self._until)
