"""Key order kept in the tier topics (``Topics(ordering="key")``,
``RetryTopic(ordering="key")``): each held key's line of copies
(:mod:`redrive.consumer.key_lines`).

A later record of a held key read from the source goes behind the line's last, as a
copy in that record's tier (``redrive-order: behind``, due at once); a copy read
when it is not its line's head is moved behind the record before it; a stale copy
(its record's live copy is elsewhere) is skipped. Only the head reaches its handler.
A line holds records of the source alone: a record another producer wrote to a tier,
or a retry of one, is handled without order (its offset is not the source's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import structlog

from redrive.consumer.key_lines import KeyLines
from redrive.consumer.key_order import KeyOrder
from redrive.consumer.message import Message
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.offsets import Partition
from redrive.consumer.publisher import Publisher
from redrive.consumer.routes import Route
from redrive.headers import RetryHeaders
from redrive.router import moved_behind, put_behind

log = structlog.get_logger("redrive.consumer")


class TierLines(KeyOrder):
    """The key lines of the App's routes keeping key order in their tiers."""

    def __init__(
        self, group: str, publisher: Publisher, metrics: ConsumerMetrics, lines: KeyLines
    ) -> None:
        self.group = group
        self.publisher = publisher
        self.metrics = metrics
        self.lines = lines

    def goes_behind(self, route: Route, message: Message) -> bool:
        key = message.key
        if key is None:  # unkeyed records keep no order
            return False
        lines, topic, partition = self.lines, route.topic, message.partition
        delivery = message.retry
        if delivery is None and message.topic != topic:
            return False  # written to a tier by another producer: no record of the source
        if delivery is None:  # from the source: behind the line's last, if any
            if not lines.held(topic, partition, key):
                return False
            place = lines.tail(topic, partition, key)
            read_at = (message.topic, partition, message.offset)
            self._copy(
                message, place, put_behind(self.group, route.topic, read_at, message.timestamp_ms)
            )
            lines.append(topic, partition, key, message.offset, place)
            self.metrics.records.labels(route.topic, "held_behind").inc()
            log.info(
                "record waits behind its key's retry",
                topic=message.topic,
                partition=partition,
                offset=message.offset,
                behind_in=place,
            )
            return True
        offset = delivery.original_offset
        if (
            delivery.order is None
            or offset is None
            or delivery.original_topic != topic
            or delivery.original_partition != partition
        ):
            return False  # a retry written without order, or of no source record: as ever
        turn = lines.where(topic, partition, key, offset, message.topic)
        if turn == "head":
            return False
        copy_log = log.bind(
            topic=message.topic, partition=partition, offset=message.offset, original_offset=offset
        )
        if turn == "stale":
            self.metrics.records.labels(route.topic, "repeat_skipped").inc()
            copy_log.info("stale copy skipped: its record waits elsewhere")
            return True
        if turn == "absent":
            copy_log.warning("ordered tier record in no key line; handled without order")
            return False
        # Not its turn: behind the record before it, wherever that one is now.
        place = lines.before(topic, partition, key, offset)
        read_at = (message.topic, message.partition, message.offset)
        self._copy(message, place, moved_behind(self.group, delivery, read_at))
        lines.place(topic, partition, key, offset, place)
        self.metrics.records.labels(route.topic, "moved_behind").inc()
        copy_log.info("record moved behind the one before it in its key's line", to=place)
        return True

    def _copy(self, message: Message, tier: str, request: RetryHeaders) -> None:
        """A record of a key's line written to ``tier``, on its partition."""
        self.publisher.send(
            tier,
            key=message.key,
            value=message.raw_value,
            user_headers=message.headers,
            redrive=request,
            partition=message.partition,
        )

    def handed_off(self, route: Route, request: RetryHeaders, key: bytes, to: str) -> None:
        topic, partition = request.original_topic, request.original_partition
        offset = request.original_offset
        if topic == route.topic and partition is not None and offset is not None:
            self.lines.place(topic, partition, key, offset, to)

    def release(self, route: Route, delivery: RetryHeaders, key: bytes | None) -> None:
        # The line is the App's own: the next copy comes when it is read.
        topic, partition = delivery.original_topic, delivery.original_partition
        offset = delivery.original_offset
        if key is None or topic != route.topic or partition is None or offset is None:
            return
        self.lines.done(topic, partition, key, offset)

    def load(self, config: Mapping[str, Any], partitions: Iterable[Partition]) -> None:
        self.lines.load(config, partitions)

    def forget(self, partitions: Iterable[Partition]) -> None:
        self.lines.forget(partitions)
