"""A consumer group's commit history, read from Kafka's ``__consumer_offsets``: every
offset a group committed for its partitions, in order, with its metadata, and
whether the commit counted (a transactional commit of an aborted transaction is in
the log but never counted). For the fault tests' diagnostics: what an App that was
killed had committed, and what its next run started from.

The records are Kafka's internal format (``OffsetCommitKey`` versions 0 and 1,
``OffsetCommitValue`` versions 0 to 4); any other record (group metadata, share
state) is skipped.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

OFFSETS_TOPIC = "__consumer_offsets"


@dataclass(frozen=True)
class Commit:
    topic: str
    partition: int
    offset: int
    metadata: str
    timestamp_ms: int
    """The commit's timestamp, as the broker stamped it."""
    log_offset: int
    """Where the commit is in ``__consumer_offsets`` (its order among the group's: a
    group's commits are all in one partition)."""
    committed: bool
    """False: written in a transaction that did not commit (aborted, or still open)."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return int(value)

    def string(self) -> str:
        length = self.take(">h")
        if length < 0:
            return ""
        value = self.data[self.at : self.at + length].decode(errors="replace")
        self.at += length
        return value

    def varint(self) -> int:
        value = shift = 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def compact_string(self) -> str:
        length = self.varint() - 1
        if length < 0:
            return ""
        value = self.data[self.at : self.at + length].decode(errors="replace")
        self.at += length
        return value


def _key(data: bytes) -> tuple[str, str, int] | None:
    """(group, topic, partition) of an offset commit's key; None for any other record."""
    reader = _Reader(data)
    if reader.take(">h") not in (0, 1):
        return None
    return reader.string(), reader.string(), reader.take(">i")


def _value(data: bytes) -> tuple[int, str, int]:
    """(offset, metadata, commit timestamp) of an offset commit's value."""
    reader = _Reader(data)
    version = reader.take(">h")
    offset = reader.take(">q")
    if version >= 3:
        reader.take(">i")  # leader epoch
    metadata = reader.compact_string() if version >= 4 else reader.string()
    return offset, metadata, reader.take(">q")


def _records(
    bootstrap: str, committed: bool, timeout_s: float
) -> Iterator[tuple[tuple[int, int], bytes, bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"offset-history-{time.time_ns()}",
            "isolation.level": "read_committed" if committed else "read_uncommitted",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        metadata = consumer.list_topics(OFFSETS_TOPIC, timeout=30).topics[OFFSETS_TOPIC]
        wanted = [TopicPartition(OFFSETS_TOPIC, p, OFFSET_BEGINNING) for p in metadata.partitions]
        consumer.assign(wanted)
        pending = {tp.partition for tp in wanted}
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                    continue
                key, value = msg.key(), msg.value()
                if key is None or value is None:
                    continue
                yield (int(msg.partition() or 0), int(msg.offset() or 0)), key, value
    finally:
        consumer.close()


def commits_of(bootstrap: str, group: str, timeout_s: float = 60) -> list[Commit]:
    """Every offset ``group`` committed, in log order, each marked whether it counted."""
    counted = {log_offset for log_offset, _, _ in _records(bootstrap, True, timeout_s)}
    found = []
    for log_offset, key, value in _records(bootstrap, False, timeout_s):
        try:
            named = _key(key)
            if named is None or named[0] != group:
                continue
            offset, metadata, stamp = _value(value)
        except (struct.error, IndexError):
            continue
        found.append(
            Commit(
                named[1], named[2], offset, metadata, stamp, log_offset[1], log_offset in counted
            )
        )
    return found
