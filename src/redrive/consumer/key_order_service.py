"""Key order kept by the retry service (``Service(ordering="key")``).

A failed record of an ordered route goes to the service as the head of its key's
queue and the App holds its key (:mod:`redrive.consumer.held_keys`); a later record
of a held key read from the source goes to the service behind it
(``redrive-order: behind``) instead of reaching its handler. The service delivers a
key's queue in runs, to the route's source or its per-group topic: the head with the
records waiting behind it, together (``redrive-run``); the App releases each once it
is done with it (``redrive-order: release``). When one of a run fails again, it goes
back as the key's new head, and the App drops the rest of that run as it reads them:
the service holds them again behind the new head (the held keys remember the failed
run, :meth:`HeldKeys.dropping`, also across a restart).

While a key's head waits for a short retry, the records read behind it are kept in the
App instead (:mod:`redrive.consumer.kept_lines`) and handled as soon as the head is
done: no round trip each. A route whose records must go through its gates one at a
time in its loop (async and batch handlers, a breaker, a dead-letter brake) sends
them to the service, as does any key after a restart (whether its queue in the service
has records behind its head is not known then).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from redrive.clock import now_ms
from redrive.consumer.held_keys import HeldKeys
from redrive.consumer.kept_lines import FULL_WAIT_MS, KeptLines
from redrive.consumer.key_order import KeyOrder, count_dropped, count_kept, count_waiting
from redrive.consumer.message import Message
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.offsets import Partition
from redrive.consumer.publisher import Publisher
from redrive.consumer.routes import Route
from redrive.consumer.strategies import Wait
from redrive.headers import RetryHeaders
from redrive.router import put_behind, released


class ServiceQueues(KeyOrder):
    """The held keys of the App's routes keeping key order in the service."""

    def __init__(
        self,
        group: str,
        requests_topic: str,
        publisher: Publisher,
        metrics: ConsumerMetrics,
        held: HeldKeys,
        kept: KeptLines,
        keeping: Mapping[str, Route],
    ) -> None:
        self.group = group
        self.requests_topic = requests_topic
        self.publisher = publisher
        self.metrics = metrics
        self.held = held
        self.kept = kept
        self.keeping = dict(keeping)
        """The routes (by topic) whose records behind a head may be kept in the App."""

    def goes_behind(self, route: Route, message: Message) -> bool | Wait:
        # A redelivery is the service's: its turn came, unless a record before it in its
        # run failed again. Unkeyed records keep no order.
        key = message.key
        if key is None:
            return False
        if message.retry is not None:
            run = message.run
            if run is None:
                return False
            # Held by its source partition, also when it came back on a per-group topic.
            failed = self.held.dropping(message.original_topic, message.original_partition, key)
            if failed is None or failed.run != run:
                return False
            if message.original_offset <= failed.offset:
                return False  # handled before the failure; its release may be lost
            count_dropped(self.metrics, route, message, run)
            return True
        where = (message.topic, message.partition)
        if self.kept.keeping(where, key):
            if self.kept.keep(message):
                count_kept(self.metrics, route, message)
                return True
            if route.per_group_topic:  # the heads come back on another topic: room soon
                return Wait(now_ms() + FULL_WAIT_MS)
            # They come back at the end of this partition: it may not wait for them.
            self._send_line(route, where, key)
        elif self.held.last(message.topic, message.partition, key) is None:
            return False
        self._send_behind(route, message)
        return True

    def _send_behind(self, route: Route, message: Message) -> None:
        """The record goes to the service, behind its key's last record there."""
        assert message.key is not None
        read_at = (message.topic, message.partition, message.offset)
        request = put_behind(self.group, route.redelivery_topic, read_at, message.timestamp_ms)
        self.publisher.send(
            self.requests_topic,
            key=message.key,
            value=message.raw_value,
            user_headers=message.headers,
            redrive=request,
        )
        self.held.hold(message.topic, message.partition, message.key, message.offset)
        count_waiting(self.metrics, route, message, "service")

    def _send_line(self, route: Route, where: tuple[str, int], key: bytes) -> None:
        """A key's kept line goes to the service, in order, behind its head."""
        for message in self.kept.take(where, key):
            self._send_behind(route, message)

    def send_overdue(self) -> None:
        """Lines kept too long (their head not back) go to the service: they hold their
        partition's committed position back."""
        for where, key in self.kept.overdue(self.keeping):
            self._send_line(self.keeping[where[0]], where, key)

    def handed_off(
        self, route: Route, request: RetryHeaders, key: bytes, to: str, run: int | None = None
    ) -> None:
        topic, partition = request.original_topic, request.original_partition
        offset = request.original_offset
        if topic is None or partition is None or offset is None:
            return
        head = self.held.last(topic, partition, key) is None
        self.held.hold(topic, partition, key, offset, run)
        if route.topic in self.keeping and self.kept.handed_off(
            (topic, partition), key, head, request.retry_at
        ):
            self._send_line(route, (topic, partition), key)  # a long wait: not in memory

    def release(self, route: Route, delivery: RetryHeaders, key: bytes | None) -> None:
        release = released(self.group, delivery)
        if release is None:
            return  # not a request redrive wrote: no queue to name
        self.publisher.send(
            self.requests_topic, key=key, value=None, user_headers=[], redrive=release
        )
        topic, partition = release.original_topic, release.original_partition
        offset = release.original_offset
        if key is None or topic is None or partition is None or offset is None:
            return
        if self.held.done(topic, partition, key, offset):
            self.kept.ready_after((topic, partition), key)

    def load(self, config: Mapping[str, Any], partitions: Iterable[Partition]) -> None:
        self.held.load(config, partitions)

    def forget(self, partitions: Iterable[Partition]) -> None:
        partitions = list(partitions)
        self.held.forget(partitions)
        self.kept.forget(partitions)
