"""Key order through retries (``ordering="key"``): a record of a key that waits for a
retry goes behind it, and the key is free once its last record is dealt with.

Two ways, by strategy: with ``service`` the waiting keys are held in the App
(:mod:`redrive.consumer.held_keys`) and the records put behind them wait in the
retry service's key queue, released one at a time; with ``topics`` and
``retry-topic`` each key's line of copies is kept in the tier topics
(:mod:`redrive.consumer.key_lines`), each copy moved behind the one before it until
its turn.

Invariant: a keyed record of an ordered route reaches its handler only when no
earlier record of its key (on its partition) waits for a retry; every record put or
moved behind is written (to the requests topic, or a tier on its partition) before
its key's state says so, and a key's state is released only once its record is
dealt with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import structlog

from redrive.clock import now_ms
from redrive.consumer.co_partitioned import check_assignor
from redrive.consumer.held_keys import HeldKeys
from redrive.consumer.key_lines import KeyLines, check_key_lines
from redrive.consumer.message import Message
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.publisher import Publisher
from redrive.consumer.routes import Route
from redrive.headers import RetryHeaders, failure_request_id, request_id

log = structlog.get_logger("redrive.consumer")


class KeyOrder:
    """The ordered routes' keys of one App (see the module)."""

    def __init__(
        self,
        group: str,
        requests_topic: str,
        publisher: Publisher,
        metrics: ConsumerMetrics,
        held: HeldKeys,
        lines: KeyLines,
    ) -> None:
        self.group = group
        self.requests_topic = requests_topic
        self.publisher = publisher
        self.metrics = metrics
        self.held = held
        self.lines = lines

    def goes_behind(self, route: Route, message: Message) -> bool:
        """A record of a held key of an ordered route goes behind the record its key
        waits for (True), instead of reaching its handler."""
        if route.lines_in_tiers:
            return message.key is not None and self._in_line(route, message)
        if (
            route.ordering is not None
            and message.retry is None
            and message.key is not None
            and self.held.last(message.topic, message.partition, message.key) is not None
        ):
            self._behind(route, message)
            return True
        return False

    def _in_line(self, route: Route, message: Message) -> bool:
        """Key order in the tier topics (:mod:`redrive.consumer.key_lines`): whether
        the record is dealt with by its key's line (True: put behind, moved behind, or
        a stale copy skipped) instead of reaching its handler (False: its turn, or a
        record of a key no line holds)."""
        key = message.key
        assert key is not None  # unkeyed records keep no order
        lines, topic, partition = self.lines, route.topic, message.partition
        delivery = message.retry
        if delivery is None:  # from the source: behind the line's last, if any
            if not lines.held(topic, partition, key):
                return False
            place = lines.tail(topic, partition, key)
            request = RetryHeaders(
                destination=route.topic,
                retry_at=now_ms(),
                attempt=0,
                partition=partition,
                group=self.group,
                original_topic=topic,
                original_partition=partition,
                original_offset=message.offset,
                original_timestamp=message.timestamp_ms,
                order="behind",
            )
            self._copy(message, place, request)
            lines.append(topic, partition, key, message.offset, place)
            self.metrics.records.labels(route.topic, "held_behind").inc()
            log.info(
                "record waits behind its key's retry",
                topic=topic,
                partition=partition,
                offset=message.offset,
                behind_in=place,
            )
            return True
        offset = delivery.original_offset
        if delivery.order is None or offset is None or delivery.original_partition != partition:
            return False  # a retry written without order: handled as ever
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
        # The same delivery, moved: its id, or for one written without (where it was
        # read names it, not the original coordinates any producer can write).
        read_at = (message.topic, message.partition, message.offset)
        moved = dataclasses.replace(
            delivery,
            retry_at=max(now_ms(), delivery.retry_at + 1),
            order="behind",
            id=delivery.id or failure_request_id(self.group, delivery.attempt, read_at, None),
        )
        self._copy(message, place, moved)
        lines.place(topic, partition, key, offset, place)
        self.metrics.records.labels(route.topic, "moved_behind").inc()
        copy_log.info("record moved behind the one before it in its key's line", to=place)
        return True

    def _copy(self, message: Message, tier: str, request: RetryHeaders) -> None:
        """A record of a key's line written to ``tier``, on its partition."""
        request = dataclasses.replace(request, id=request.id or request_id(request))
        self.publisher.send(
            tier,
            key=message.key,
            value=message.raw_value,
            user_headers=message.headers,
            redrive=request,
            partition=message.partition,
        )

    def _behind(self, route: Route, message: Message) -> None:
        """A record of a held key: to the retry service, behind the record it waits for
        (not handled, so not failed: attempt 0, due at once when its turn comes)."""
        request = RetryHeaders(
            destination=route.redelivery_topic,
            retry_at=now_ms(),
            attempt=0,
            partition=message.partition,
            group=self.group,
            original_topic=message.topic,
            original_partition=message.partition,
            original_offset=message.offset,
            original_timestamp=message.timestamp_ms,
            order="behind",
        )
        request = dataclasses.replace(request, id=request_id(request))
        self.publisher.send(
            self.requests_topic,
            key=message.key,
            value=message.raw_value,
            user_headers=message.headers,
            redrive=request,
        )
        assert message.key is not None  # only keyed records are held
        self.held.hold(message.topic, message.partition, message.key, message.offset)
        self.metrics.records.labels(route.topic, "held_behind").inc()
        log.info(
            "record waits behind its key's retry",
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
        )

    def release(self, route: Route, delivery: RetryHeaders, key: bytes | None) -> None:
        """The App is done with a record of a key's queue (handled, or a dead letter):
        the retry service may deliver the next; the key is free if it was the last."""
        topic = delivery.original_topic
        partition = delivery.original_partition
        offset = delivery.original_offset
        if topic is None or partition is None or offset is None:
            return  # not a request redrive wrote: no queue to name
        if route.lines_in_tiers:  # the line is the App's own: the next copy comes
            if key is not None and topic == route.topic:
                self.lines.done(topic, partition, key, offset)
            return
        release = RetryHeaders(
            destination=delivery.destination,
            retry_at=now_ms(),
            attempt=delivery.attempt,
            group=self.group,
            original_topic=topic,
            original_partition=partition,
            original_offset=offset,
            order="release",
        )
        release = dataclasses.replace(release, id=request_id(release))
        self.publisher.send(
            self.requests_topic, key=key, value=None, user_headers=[], redrive=release
        )
        if key is not None:
            self.held.done(topic, partition, key, offset)

    def hold(self, route: Route, request: RetryHeaders, key: bytes | None, to: str) -> None:
        """A record of an ordered route was handed off (to topic ``to``): its key is held."""
        topic, partition = request.original_topic, request.original_partition
        offset = request.original_offset
        if key is None or topic is None or partition is None or offset is None:
            return
        if route.lines_in_tiers:
            self.lines.place(topic, partition, key, offset, to)
        else:
            self.held.hold(topic, partition, key, offset)


def check_key_order(route: Route, transactional: bool, settings: Mapping[str, Any]) -> None:
    """What key order through retries needs of the App (``settings``: its consumer's
    librdkafka settings): the tiers' lines, transactions and an assignor keeping a
    partition with its tiers; the service's per-group topic, such an assignor."""
    if route.lines_in_tiers:
        check_key_lines(route.topic, route.strategy.name, transactional, settings)
    elif route.ordering is not None and route.per_group_topic:
        check_assignor(route.topic, "per-group retry topic", settings)
