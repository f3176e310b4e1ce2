"""Hand-offs to Kafka: retry requests, tier records and dead letters.

A hand-off counts only once the broker acknowledged it, since the consumer commits
the offset past a record right after. `flush` waits for every acknowledgement and
produces again whatever the broker refused for a passing reason; it gives up only
when the app is stopping, and then the offsets are not committed (the records come
back on restart: at-least-once).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

import structlog
from confluent_kafka import KafkaError, Message, Producer

from redrive.headers import Header, RetryHeaders, encode
from redrive.kafka import produce_patiently
from redrive.signing import KeyRing

log = structlog.get_logger("redrive.consumer")


class HandOffFailed(Exception):
    """Records could not be handed to Kafka before the app stopped."""


@dataclass(frozen=True, slots=True)
class _Outgoing:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    partition: int | None


class Publisher:
    def __init__(self, producer: Producer, stop: threading.Event) -> None:
        self._producer = producer
        self._stop = stop
        self._failed: list[tuple[_Outgoing, KafkaError]] = []
        self.in_flight = 0
        self.earliest_due_ms: int | None = None
        """The earliest due time of the hand-offs sent since :meth:`committed`: with
        transactions, none of them is visible to its reader before the commit."""

    def send(
        self,
        topic: str,
        *,
        key: bytes | None,
        value: bytes | None,
        user_headers: list[Header],
        redrive: RetryHeaders,
        partition: int | None = None,
    ) -> None:
        out = _Outgoing(topic, key, value, encode(redrive, user_headers), partition)
        self._produce(self._signed(out))
        if self.earliest_due_ms is None or redrive.retry_at < self.earliest_due_ms:
            self.earliest_due_ms = redrive.retry_at

    def _signed(self, out: _Outgoing) -> _Outgoing:
        """A hand-off as it is written: unsigned here."""
        return out

    def committed(self) -> None:
        """The hand-offs sent so far are committed (visible to their readers)."""
        self.earliest_due_ms = None

    def put(self, topic: str, *, key: bytes, value: bytes | None, partition: int) -> None:
        """Write a record of redrive's own bookkeeping (no headers), acknowledged and
        retried as the hand-offs are."""
        self._produce(_Outgoing(topic, key, value, [], partition))

    def _produce(self, out: _Outgoing) -> None:
        def delivered(err: KafkaError | None, msg: Message) -> None:
            self.in_flight -= 1
            if err is not None:
                self._failed.append((out, err))

        produce_patiently(
            self._producer,
            out.topic,
            key=out.key,
            value=out.value,
            headers=out.headers,
            on_delivery=delivered,
            partition=out.partition,
        )
        self.in_flight += 1

    def flush(self) -> None:
        """Return once every hand-off is acknowledged; raise HandOffFailed if stopped first."""
        while True:
            self._producer.flush(1.0)
            failed, self._failed = self._failed, []
            for out, err in failed:
                if err.fatal() or not err.retriable():
                    # Producing it again cannot succeed (too large, not authorized...):
                    # stop loudly; the record's offset is not committed, nothing is lost.
                    raise HandOffFailed(f"cannot produce to {out.topic!r}: {err.str()}")
                log.warning("hand-off refused; producing again", topic=out.topic, error=err.str())
                self._produce(out)
            if self.in_flight == 0 and not self._failed:
                return
            if self._stop.is_set():
                raise HandOffFailed(
                    f"{self.in_flight + len(self._failed)} hand-offs unacknowledged"
                )


class SigningPublisher(Publisher):
    """A publisher whose every record to the requests topic is signed with ``keys``
    (:mod:`redrive.signing`): retries, dead letters for the service, a key's records
    put behind and its releases. What goes elsewhere (tiers, DLQ topics) is not."""

    def __init__(
        self, producer: Producer, stop: threading.Event, keys: KeyRing, requests_topic: str
    ) -> None:
        super().__init__(producer, stop)
        self._keys = keys
        self._requests_topic = requests_topic

    def _signed(self, out: _Outgoing) -> _Outgoing:
        if out.topic != self._requests_topic:
            return out
        return replace(out, headers=self._keys.signed(out.headers, out.key, out.value))


def publisher_for(
    producer: Producer, stop: threading.Event, keys: KeyRing | None, requests_topic: str
) -> Publisher:
    """The App's publisher: signing what it writes to the requests topic when it has
    keys (and then only: the unsigned path stays as it was)."""
    if keys is None:
        return Publisher(producer, stop)
    return SigningPublisher(producer, stop, keys, requests_topic)
