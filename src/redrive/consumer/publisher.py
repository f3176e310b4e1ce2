"""Hand-offs to Kafka: retry requests, tier records and dead letters.

A hand-off counts only once the broker acknowledged it, since the consumer commits
the offset past a record right after. `flush` waits for every acknowledgement and
produces again whatever the broker refused for a passing reason; it gives up only
when the app is stopping, and then the offsets are not committed (the records come
back on restart: at-least-once).

An App with signing keys writes through a :class:`SigningPublisher`: every record it
writes is signed (the requests topic, the tiers, the single retry topic, key order's
copies and bookkeeping, the dead-letter topics), and every ``redrive-id`` it writes
to the requests topic is sealed (:meth:`redrive.signing.KeyRing.sealed_id`), so that no
one without the key can send a request under it first.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import structlog
from confluent_kafka import KafkaError, Message, Producer

from redrive.consumer.bookkeeping import sealed_headers
from redrive.headers import ID, Header, RetryHeaders, encode
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
        """Write a hand-off: ``redrive`` with the user's headers. An id in a request
        to the requests topic is the plain one its fields make, never one read off a
        delivery (sealed already: :class:`SigningPublisher` seals what it writes)."""
        headers = self._headers(topic, key, value, encode(redrive, user_headers))
        self._produce(_Outgoing(topic, key, value, headers, partition))
        if self.earliest_due_ms is None or redrive.retry_at < self.earliest_due_ms:
            self.earliest_due_ms = redrive.retry_at

    def _headers(
        self, topic: str, key: bytes | None, value: bytes | None, headers: list[Header]
    ) -> list[Header]:
        """A hand-off's headers as they are written: as encoded, here."""
        return headers

    def committed(self) -> None:
        """The hand-offs sent so far are committed (visible to their readers)."""
        self.earliest_due_ms = None

    def put(self, topic: str, *, key: bytes, value: bytes | None, partition: int) -> None:
        """Write a record of redrive's own bookkeeping (no headers here; sealed by a
        :class:`SigningPublisher`), acknowledged and retried as the hand-offs are."""
        headers = self._bookkeeping(topic, partition, key, value)
        self._produce(_Outgoing(topic, key, value, headers, partition))

    def _bookkeeping(
        self, topic: str, partition: int, key: bytes, value: bytes | None
    ) -> list[Header]:
        """A bookkeeping record's headers: none, here."""
        return []

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
    """A publisher that signs every record it writes with ``keys``
    (:mod:`redrive.signing`) and seals the ``redrive-id`` of what it writes to the
    requests topic (see the module).

    Invariant: an id is sealed exactly once, here, as it is written: the ids given to
    :meth:`send` are the plain ones their fields make (:mod:`redrive.router`), and a
    hand-off produced again after the broker refused it is the record as first
    written. The same plain id under the same current key is the same sealed id, so a
    hand-off repeated after a crash is a repeat to its receiver."""

    def __init__(
        self, producer: Producer, stop: threading.Event, keys: KeyRing, requests_topic: str
    ) -> None:
        super().__init__(producer, stop)
        self._keys = keys
        self._requests_topic = requests_topic

    def _headers(
        self, topic: str, key: bytes | None, value: bytes | None, headers: list[Header]
    ) -> list[Header]:
        if topic == self._requests_topic:
            seal = self._keys.sealed_id
            headers = [
                (name, seal(raw.decode("ascii")).encode("ascii"))
                if name == ID and raw is not None
                else (name, raw)
                for name, raw in headers
            ]
        return self._keys.signed(headers, key, value)

    def _bookkeeping(
        self, topic: str, partition: int, key: bytes, value: bytes | None
    ) -> list[Header]:
        return sealed_headers(self._keys, topic, partition, key, value)


def publisher_for(
    producer: Producer, stop: threading.Event, keys: KeyRing | None, requests_topic: str
) -> Publisher:
    """The App's publisher: signing what it writes when it has keys (and then only:
    the unsigned path stays as it was)."""
    if keys is None:
        return Publisher(producer, stop)
    return SigningPublisher(producer, stop, keys, requests_topic)
