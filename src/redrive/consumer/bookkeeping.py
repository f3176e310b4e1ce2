"""Key order's bookkeeping records (held keys, key lines), sealed by a signing App.

With ``ordering="key"`` an App writes what it holds to ``<group>.<topic>.held``
(:mod:`redrive.consumer.held_keys`, :mod:`redrive.consumer.key_lines`) and reads it
back when a partition is assigned. Anyone who may write that topic could otherwise
hold a key for ever (its later records waiting behind nothing) or free one early (a
forged tombstone: its records overtake their retry). So an App with keys writes each
such record with ``redrive-destination: <held topic>``, ``redrive-partition: <p>`` and
a signature over them, the record's key and its value (:meth:`KeyRing.signed`), and
reading back it ignores any record that does not verify there, on that topic and
partition: logged at warning with its topic, partition and offset, and counted as
``redrive_consumer_records_total{outcome="bookkeeping_ignored"}`` of its route.

Invariant: :meth:`BookkeepingCheck.believed` is True for every record
:func:`sealed_headers` made with a key of the ring, read where it was written, and
(with keys) for no other but, with ``trust_unsigned``, an unsigned one; it never
raises. Without keys everything is believed, as before signing. (A signed record of
the same key and partition written again later, a replay of an older state, still
verifies: the held topic is for the App alone to write, which Kafka ACLs say.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog
from confluent_kafka import Message

from redrive.headers import DESTINATION, PARTITION, Header
from redrive.kafka import read_headers
from redrive.returns import signature_of
from redrive.signing import KeyRing, Verdict

if TYPE_CHECKING:
    from prometheus_client import Counter

log = structlog.get_logger("redrive.consumer")


def sealed_headers(
    keys: KeyRing, topic: str, partition: int, key: bytes | None, value: bytes | None
) -> list[Header]:
    """The headers of a bookkeeping record written to ``topic`` at ``partition``: where
    it belongs, signed with the ring's current key over that, its key and its value."""
    where: list[Header] = [(DESTINATION, topic.encode()), (PARTITION, str(partition).encode())]
    return keys.signed(where, key, value)


class BookkeepingCheck:
    """Whether a bookkeeping record read back may be believed (see the module)."""

    def __init__(
        self, keys: KeyRing | None, trust_unsigned: bool = False, records: Counter | None = None
    ) -> None:
        self.keys = keys
        self.trust_unsigned = trust_unsigned
        self.records = records
        """``redrive_consumer_records_total``, where the records ignored are counted."""

    def believed(self, msg: Message, route: str) -> bool:
        """Whether ``msg``, read from the held topic of the route of ``route``, was
        written there by a holder of our keys; when not, logged and counted."""
        if self.keys is None:
            return True
        why = self.doubt(msg)
        if why is None:
            return True
        topic, partition = str(msg.topic()), int(msg.partition() or 0)
        log.warning(
            "key-order record not written by this App's keys; ignored",
            topic=topic,
            partition=partition,
            offset=msg.offset(),
            reason=why,
        )
        if self.records is not None:
            self.records.labels(route, "bookkeeping_ignored").inc()
        return False

    def doubt(self, msg: Message) -> str | None:
        """Why ``msg`` is not to be believed, or None (keys given)."""
        assert self.keys is not None
        headers, unreadable = read_headers(msg)
        if unreadable is not None:
            return unreadable
        destination = partition = None
        for name, raw in headers:
            if name == DESTINATION:
                destination = raw
            elif name == PARTITION:
                partition = raw
        signature = signature_of(headers)
        if signature is None and self.trust_unsigned:
            return None
        if destination != str(msg.topic()).encode() or partition != str(msg.partition()).encode():
            return "it does not name the topic and partition it was read on"
        found = self.keys.verify(headers, msg.key(), msg.value(), signature)
        if found.verdict is Verdict.VALID:
            return None
        return f"its signature does not verify: {found.problem}"
