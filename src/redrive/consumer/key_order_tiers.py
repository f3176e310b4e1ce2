"""Key order kept in the tier topics (``Topics(ordering="key")``,
``RetryTopic(ordering="key")``): each held key's line of copies
(:mod:`redrive.consumer.key_lines`).

A later record of a held key read from the source goes behind the line's last, as a
copy in that record's tier (``redrive-order: behind``, due at once); a copy read
when it is not its line's head is moved behind the record before it; a stale copy
(its record's live copy is elsewhere) is skipped. Only the head reaches its handler.
A line holds records of the source alone: a record another producer wrote to a tier,
or a retry of one, is handled without order (its offset is not the source's).

While a line's head waits for a short retry, the records read behind it are kept in
the App instead of copied (:mod:`redrive.consumer.kept_lines`), and handled as soon as
the head is done: a line moves no copies then. A route whose records must go through
its gates one at a time in its loop (async and batch handlers, a dead-letter brake)
copies them, as does any line after a restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import structlog

from redrive.clock import now_ms
from redrive.consumer.kept_lines import FULL_WAIT_MS, KeptLines
from redrive.consumer.key_lines import KeyLines
from redrive.consumer.key_order import KeyOrder, count_kept, count_waiting
from redrive.consumer.message import Message
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.offsets import Partition
from redrive.consumer.publisher import Publisher
from redrive.consumer.routes import Route
from redrive.consumer.strategies import Wait
from redrive.headers import RetryHeaders
from redrive.router import moved_behind, put_behind

log = structlog.get_logger("redrive.consumer")


class TierLines(KeyOrder):
    """The key lines of the App's routes keeping key order in their tiers."""

    def __init__(
        self,
        group: str,
        publisher: Publisher,
        metrics: ConsumerMetrics,
        lines: KeyLines,
        kept: KeptLines,
        keeping: Mapping[str, Route],
    ) -> None:
        self.group = group
        self.publisher = publisher
        self.metrics = metrics
        self.lines = lines
        self.kept = kept
        self.keeping = dict(keeping)
        """The routes (by topic) whose records behind a head may be kept in the App."""

    def goes_behind(self, route: Route, message: Message) -> bool | Wait:
        key = message.key
        if key is None:  # unkeyed records keep no order
            return False
        lines, topic, partition = self.lines, route.topic, message.partition
        delivery = message.retry
        if delivery is None and message.topic != topic:
            return False  # written to a tier by another producer: no record of the source
        if delivery is None:  # from the source: behind the line's last, if any
            where = (topic, partition)
            if self.kept.keeping(where, key):
                if self.kept.keep(message):
                    count_kept(self.metrics, route, message)
                    return True
                return Wait(now_ms() + FULL_WAIT_MS)  # the partition's bound: room soon
            elif not lines.held(topic, partition, key):
                return False
            self._put_behind(route, message)
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

    def _put_behind(self, route: Route, message: Message) -> None:
        """A record read from the source behind its line's last, as a copy there."""
        assert message.key is not None
        place = self.lines.tail(route.topic, message.partition, message.key)
        read_at = (message.topic, message.partition, message.offset)
        self._copy(
            message, place, put_behind(self.group, route.topic, read_at, message.timestamp_ms)
        )
        self.lines.append(route.topic, message.partition, message.key, message.offset, place)
        count_waiting(self.metrics, route, message, place)

    def _copy_line(self, route: Route, where: Partition, key: bytes) -> None:
        """A key's kept line copied, in order, behind its head in the tiers."""
        for message in self.kept.take(where, key):
            self._put_behind(route, message)

    def send_overdue(self) -> None:
        """Lines kept too long (their head not back) are copied to the tiers: they hold
        their partition's committed position back."""
        for where, key in self.kept.overdue(self.keeping):
            self._copy_line(self.keeping[where[0]], where, key)

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

    def handed_off(
        self, route: Route, request: RetryHeaders, key: bytes, to: str, run: int | None = None
    ) -> None:
        topic, partition = request.original_topic, request.original_partition
        offset = request.original_offset
        if topic != route.topic or partition is None or offset is None:
            return
        head = not self.lines.held(topic, partition, key)
        self.lines.place(topic, partition, key, offset, to)
        if route.topic in self.keeping and self.kept.handed_off(
            (topic, partition), key, head, request.retry_at
        ):
            self._copy_line(route, (topic, partition), key)  # a long wait: not in memory

    def release(self, route: Route, delivery: RetryHeaders, key: bytes | None) -> None:
        # The line is the App's own: the next copy comes when it is read.
        topic, partition = delivery.original_topic, delivery.original_partition
        offset = delivery.original_offset
        if key is None or topic != route.topic or partition is None or offset is None:
            return
        if self.lines.done(topic, partition, key, offset):
            self.kept.ready_after((topic, partition), key)

    def load(self, config: Mapping[str, Any], partitions: Iterable[Partition]) -> None:
        self.lines.load(config, partitions)

    def forget(self, partitions: Iterable[Partition]) -> None:
        partitions = list(partitions)
        self.lines.forget(partitions)
        self.kept.forget(partitions)
