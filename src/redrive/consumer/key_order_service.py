"""Key order kept by the retry service (``Service(ordering="key")``).

A failed record of an ordered route goes to the service as the head of its key's
queue and the App holds its key (:mod:`redrive.consumer.held_keys`); a later record
of a held key read from the source goes to the service behind it
(``redrive-order: behind``) instead of reaching its handler. The service delivers a
key's queue one record at a time, to the route's source or its per-group topic, and
the App releases each once it is done with it (``redrive-order: release``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import structlog

from redrive.consumer.held_keys import HeldKeys
from redrive.consumer.key_order import KeyOrder
from redrive.consumer.message import Message
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.offsets import Partition
from redrive.consumer.publisher import Publisher
from redrive.consumer.routes import Route
from redrive.headers import RetryHeaders
from redrive.router import put_behind, released

log = structlog.get_logger("redrive.consumer")


class ServiceQueues(KeyOrder):
    """The held keys of the App's routes keeping key order in the service."""

    def __init__(
        self,
        group: str,
        requests_topic: str,
        publisher: Publisher,
        metrics: ConsumerMetrics,
        held: HeldKeys,
    ) -> None:
        self.group = group
        self.requests_topic = requests_topic
        self.publisher = publisher
        self.metrics = metrics
        self.held = held

    def goes_behind(self, route: Route, message: Message) -> bool:
        # A redelivery is the service's: its turn came. Unkeyed records keep no order.
        key = message.key
        if message.retry is not None or key is None:
            return False
        if self.held.last(message.topic, message.partition, key) is None:
            return False
        read_at = (message.topic, message.partition, message.offset)
        request = put_behind(self.group, route.redelivery_topic, read_at, message.timestamp_ms)
        self.publisher.send(
            self.requests_topic,
            key=key,
            value=message.raw_value,
            user_headers=message.headers,
            redrive=request,
        )
        self.held.hold(message.topic, message.partition, key, message.offset)
        self.metrics.records.labels(route.topic, "held_behind").inc()
        log.info(
            "record waits behind its key's retry",
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
        )
        return True

    def handed_off(self, route: Route, request: RetryHeaders, key: bytes, to: str) -> None:
        topic, partition = request.original_topic, request.original_partition
        offset = request.original_offset
        if topic is not None and partition is not None and offset is not None:
            self.held.hold(topic, partition, key, offset)

    def release(self, route: Route, delivery: RetryHeaders, key: bytes | None) -> None:
        release = released(self.group, delivery)
        if release is None:
            return  # not a request redrive wrote: no queue to name
        self.publisher.send(
            self.requests_topic, key=key, value=None, user_headers=[], redrive=release
        )
        topic, partition = release.original_topic, release.original_partition
        offset = release.original_offset
        if key is not None and topic is not None and partition is not None and offset is not None:
            self.held.done(topic, partition, key, offset)

    def load(self, config: Mapping[str, Any], partitions: Iterable[Partition]) -> None:
        self.held.load(config, partitions)

    def forget(self, partitions: Iterable[Partition]) -> None:
        self.held.forget(partitions)
