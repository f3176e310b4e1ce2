"""Small bridges between confluent-kafka's types and redrive's.

confluent-kafka's stubs type headers loosely (str or bytes values, a list or a dict);
what a consumer actually receives is a list of (str, bytes | None). These helpers
say so once, instead of casts scattered through the code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from confluent_kafka import Consumer, Message

from redrive.headers import Header

KafkaHeaders = list[tuple[str, str | bytes | None]]


def headers_of(msg: Message) -> list[Header]:
    """A consumed message's headers as redrive reads them (empty list when none)."""
    return cast(list[Header], list(msg.headers() or []))


def kafka_headers(headers: Sequence[Header]) -> KafkaHeaders:
    """Headers in the form Producer.produce accepts."""
    return cast(KafkaHeaders, list(headers))


def consume_available(
    consumer: Consumer, max_messages: int, timeout_s: float, linger_s: float = 0.0
) -> list[Message]:
    """Up to `max_messages`, returning as soon as at least one is there.

    `Consumer.consume(n, timeout)` waits out the whole timeout unless n messages
    arrive, which adds that timeout to every message's latency at low load. Blocking
    in `poll` for the first message and then taking what is already fetched
    (`consume(..., timeout=0)`) keeps batching under load and latency low otherwise.
    `linger_s` lets a batch fill for that long once its first message is there, for
    callers whose cost is per batch (a database commit) rather than per message.
    """
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    if max_messages <= 1:
        return [first]
    return [first, *consumer.consume(max_messages - 1, timeout=linger_s)]
