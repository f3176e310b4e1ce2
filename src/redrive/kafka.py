"""Small bridges between confluent-kafka's types and redrive's.

confluent-kafka's stubs type headers loosely (str or bytes values, a list or a dict);
what a consumer actually receives is a list of (str, bytes | None). These helpers
say so once, instead of casts scattered through the code.

They are also the one place where a consumed record's headers are read, because
reading them can fail: see :func:`read_headers`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, Final, cast

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaError, Message, Producer

from redrive.headers import Header

KafkaHeaders = list[tuple[str, str | bytes | None]]

BATCH_WIDE_REFUSALS: Final = frozenset(
    {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_RECORD, KafkaError.RECORD_LIST_TOO_LARGE}
)
"""Errors a broker returns for a whole batch of records: every message of the batch
gets one, though maybe only one of them is at fault. Sent again alone, the others go."""

# What CPython's repr prints for an empty slot of a tuple (PyObject_Repr(NULL)).
_EMPTY_SLOT: Final = "(<NULL>, "

# `msg.headers()` written as a method call is specialised by CPython 3.11+'s adaptive
# interpreter into a direct C call that does not check for an exception left set with
# a result; confluent-kafka does exactly that on a bad header name, and the stale
# exception then surfaces later at an arbitrary line. Called through methodcaller, the
# call goes through the checked C path, which raises SystemError right here.
_headers: Final[Any] = operator.methodcaller("headers")


def read_headers(msg: Message) -> tuple[list[Header], str | None]:
    """A consumed record's headers, and None, or what could be read and what could not.

    Any Kafka producer can write a header whose NAME is not UTF-8 (kcat does it from
    its command line). confluent-kafka (2.16) decodes every name strictly: on such a
    name, ``Message.headers()`` raises SystemError, and leaves on the message a list
    whose tuple for that header has an empty name slot, which crashes the interpreter
    if touched. Calling ``headers()`` once more returns that list; an empty slot is
    told apart by the tuple's repr without touching it, so the other headers (and the
    bad ones' values) are kept, and the problem is returned for the caller to report.
    The raw bytes of a bad name are gone: confluent-kafka frees them after decoding.

    (A name with a NUL byte cannot be detected: confluent-kafka reads names as C
    strings, so it arrives cut at the NUL.)
    """
    try:
        headers = _headers(msg)
    except (SystemError, UnicodeDecodeError, ValueError) as exc:
        first = exc
    else:
        # The message's own list, not a copy: this is on every record's path.
        return cast("list[Header]", headers) if headers else [], None
    try:
        cached = _headers(msg) or []
    except Exception:  # noqa: BLE001 - nothing more can be read of these headers
        return [], f"headers unreadable: {_cause(first)}; none could be read"
    kept: list[Header] = []
    lost: list[int] = []
    for index, header in enumerate(cached):
        if repr(header).startswith(_EMPTY_SLOT):
            lost.append(index)
        else:
            kept.append(cast(Header, header))
    where = ", ".join(str(i) for i in lost[:10]) + (", ..." if len(lost) > 10 else "")
    problem = (
        f"headers unreadable: {len(lost)} of {len(cached)} header name(s) are not valid "
        f"UTF-8 (position {where}); {_cause(first)}; those headers were dropped, "
        f"the {len(kept)} others kept"
    )
    return kept, problem


def _cause(exc: BaseException) -> str:
    """The first bad name's bytes, when confluent-kafka's error chain still has them."""
    seen: BaseException | None = exc
    for _ in range(8):  # the chain is short; bounded in case it loops
        if seen is None:
            break
        if isinstance(seen, UnicodeDecodeError) and isinstance(seen.object, bytes):
            return f"first bad name {seen.object[:100]!r}"
        seen = seen.__cause__ or seen.__context__
    return f"{type(exc).__name__} from confluent-kafka"


def message_time(msg: Message) -> int | None:
    """A message's own timestamp; None when it has none (type 0) or it is negative: the
    only negative time a producer may mean is -1, none, and a later header cannot hold it."""
    kind, value = msg.timestamp()
    return value if kind != TIMESTAMP_NOT_AVAILABLE and value >= 0 else None


def headers_of(msg: Message) -> list[Header]:
    """A consumed message's headers as redrive reads them (empty list when none);
    unreadable ones are left out (see :func:`read_headers` to learn of them)."""
    return read_headers(msg)[0]


UNASSIGNED_PARTITION = -1
"""librdkafka's RD_KAFKA_PARTITION_UA: the partitioner chooses (by the key)."""


def kafka_headers(headers: Sequence[Header]) -> KafkaHeaders:
    """Headers in the form Producer.produce accepts (a list is passed as it is: this is
    on every delivery's path)."""
    return cast(KafkaHeaders, headers if type(headers) is list else list(headers))


def produce_patiently(
    producer: Producer,
    topic: str,
    *,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Header],
    on_delivery: Callable[[KafkaError | None, Message], None],
    partition: int | None = None,
    drain_s: float = 0.05,
) -> None:
    """Queue one record, waiting (serving delivery callbacks) while the queue is full.

    librdkafka refuses a record with BufferError when its local queue is full; the
    cure is to let deliveries drain and try again, never to drop the record or to
    sleep without polling (the callbacks that free the queue run inside poll).
    A KafkaException (refused before sending: too large, unknown partition...) is
    the caller's to handle: it says something about the record, not about the queue.
    """
    # Positional, as Producer.produce takes them (value, key, partition, on_delivery):
    # no keyword dictionary on every delivery's path.
    as_kafka = kafka_headers(headers)
    by = UNASSIGNED_PARTITION if partition is None else partition
    while True:
        try:
            producer.produce(topic, value, key, by, on_delivery, headers=as_kafka)
            return
        except BufferError:
            producer.poll(drain_s)


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
