"""Small bridges between confluent-kafka's types and redrive's.

confluent-kafka's stubs type headers loosely (str or bytes values, a list or a dict);
what a consumer actually receives is a list of (str, bytes | None). These helpers
say so once, instead of casts scattered through the code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from confluent_kafka import Message

from redrive.headers import Header

KafkaHeaders = list[tuple[str, str | bytes | None]]


def headers_of(msg: Message) -> list[Header]:
    """A consumed message's headers as redrive reads them (empty list when none)."""
    return cast(list[Header], list(msg.headers() or []))


def kafka_headers(headers: Sequence[Header]) -> KafkaHeaders:
    """Headers in the form Producer.produce accepts."""
    return cast(KafkaHeaders, list(headers))
