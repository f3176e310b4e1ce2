"""The record a dead letter names but does not hold, read from its topic.

A share group's dead letter (:mod:`.share_group`) holds by default only where its
record is. While the topic retains the record, intake reads it there, at its offset,
and the letter gets its key, value, headers and timestamp; once the record is gone
(retention, compaction, a deleted topic) the letter is kept as it is and its reason
says that the record is unknown. A broker that does not answer is not a verdict: the
read raises :class:`~redrive.topic_admin.MetadataUnavailable`, and intake waits and
reads the batch again, as for any metadata it cannot get.

The reader is a consumer of its own with partitions assigned, never subscribed: it
joins no group and commits nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

import structlog
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from redrive.deadlines import Deadline
from redrive.kafka import message_time, read_headers
from redrive.records import DeadLetterRecord
from redrive.service.ingest import IngestedLetter
from redrive.topic_admin import MetadataUnavailable

log = structlog.get_logger("redrive.intake")

READ_TIMEOUT_S: Final = 10.0
_GONE: Final = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)


class Originals:
    """Completes letters that need their record (one reader, made on first use)."""

    def __init__(self, kafka_config: dict[str, Any]) -> None:
        self._config = {
            **kafka_config,
            "group.id": "redrive-originals",  # required by the client; never joined
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
        self._consumer: Consumer | None = None

    def complete(self, ingested: IngestedLetter) -> DeadLetterRecord:
        """The letter with its record, or saying why it has none."""
        letter = ingested.letter
        topic, partition, offset = (
            letter.original_topic,
            letter.original_partition,
            letter.original_offset,
        )
        if not ingested.needs_record or topic is None or partition is None or offset is None:
            return letter
        where = f"{topic}[{partition}]@{offset}"
        found = self._read(topic, partition, offset)
        if found is None:
            log.warning("dead letter's record no longer retained", record=where)
            return dataclasses.replace(
                letter,
                reason=f"{letter.reason}; the record is no longer in {where}: "
                "its key, value and headers are unknown",
                record_missing=True,
            )
        key, value, headers, timestamp = found
        return dataclasses.replace(
            letter,
            key=key,
            value=value,
            headers=headers,
            original_timestamp=timestamp,
            reason=f"{letter.reason}; its record read from {where}",
        )

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _read(
        self, topic: str, partition: int, offset: int
    ) -> tuple[bytes | None, bytes | None, list[Any], int | None] | None:
        """The record at ``offset``; None when the topic no longer has it."""
        consumer = self._consumer or Consumer(self._config)
        self._consumer = consumer
        tp = TopicPartition(topic, partition, offset)
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=READ_TIMEOUT_S)
        except KafkaException as exc:
            if exc.args[0].code() in _GONE:
                return None
            raise MetadataUnavailable(f"cannot read {topic}[{partition}]: {exc}") from exc
        if not low <= offset < high:
            return None
        consumer.assign([tp])
        try:
            deadline = Deadline(READ_TIMEOUT_S)
            while not deadline.passed():
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return None  # past the end without meeting it: not retained
                    if error.code() in _GONE:
                        return None
                    continue  # a transient error: the client retries
                at = msg.offset()
                if at is None or at < offset:
                    continue
                if at > offset:
                    return None  # compacted away, or an aborted transaction's
                headers, _ = read_headers(msg)
                return msg.key(), msg.value(), headers, message_time(msg)
        finally:
            consumer.unassign()
        raise MetadataUnavailable(f"cannot read {topic}[{partition}]@{offset} in time")
