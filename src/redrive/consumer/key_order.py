"""Key order through retries (``ordering="key"``): a record of a key that waits for a
retry goes behind it, and the key is free once its last record is dealt with.

One interface, :class:`KeyOrder`, two ways behind it, by strategy: with ``Service``
the waiting keys are held in the App and the records put behind them wait in the
retry service's key queue, delivered back in runs
(:mod:`redrive.consumer.key_order_service`); with ``Topics`` and ``RetryTopic`` each
key's line of copies is kept in the tier topics, each copy moved behind the one
before it until its turn (:mod:`redrive.consumer.key_order_tiers`). A session makes
one of each its routes need and gives each ordered route its own
(:func:`key_orders`); the pipeline's key-order gate and its outcomes call it, the
assignment loads and forgets what it keeps as partitions come and go.

Invariant: a keyed record of an ordered route reaches its handler only when no
earlier record of its key (on its partition) waits for a retry; every record put or
moved behind is written (to the requests topic, or a tier on its partition) before
its key's state says so, and a key's state is released only once its record is
dealt with.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any

import structlog

from redrive.consumer.co_partitioned import check_assignor
from redrive.consumer.key_lines import check_key_lines
from redrive.consumer.message import Message
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.offsets import Partition
from redrive.consumer.routes import Route
from redrive.consumer.strategies import Wait
from redrive.headers import RetryHeaders

log = structlog.get_logger("redrive.consumer")


class KeyOrder(ABC):
    """How the ordered routes of one kind keep their keys in order (see the module)."""

    @abstractmethod
    def goes_behind(self, route: Route, message: Message) -> bool | Wait:
        """Whether a record goes behind the record its key waits for (True: dealt
        with so, it does not reach its handler); a Wait when it is to, but there is no
        room yet (its partition waits)."""

    @abstractmethod
    def handed_off(
        self, route: Route, request: RetryHeaders, key: bytes, to: str, run: int | None = None
    ) -> None:
        """A record of an ordered route was handed off (to topic ``to``) as the head
        of its key's queue or line: its key waits for it. ``run``: the run of its key's
        queue it was delivered in, if it was (the rest of that run is the service's)."""

    @abstractmethod
    def release(self, route: Route, delivery: RetryHeaders, key: bytes | None) -> None:
        """The App is done with a record of a key's queue or line (handled, or a dead
        letter): the next may come; the key is free if it was the last."""

    @abstractmethod
    def load(self, config: Mapping[str, Any], partitions: Iterable[Partition]) -> None:
        """Partitions assigned: their keys' state read back (committed only)."""

    @abstractmethod
    def forget(self, partitions: Iterable[Partition]) -> None:
        """Partitions left: their keys' state is no longer this App's."""


def count_kept(metrics: ConsumerMetrics, route: Route, message: Message) -> None:
    """A record of a held key is kept behind its head in the App's memory: counted, and
    logged at debug level only (it writes nothing, and under a failing downstream most
    records would log this)."""
    metrics.records.labels(route.topic, "held_behind").inc()
    log.debug(
        "record kept behind its key's retry",
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
    )


def count_waiting(metrics: ConsumerMetrics, route: Route, message: Message, where: str) -> None:
    """A record of a held key waits behind its head (``where``: in the service, in a
    tier): counted and logged."""
    metrics.records.labels(route.topic, "held_behind").inc()
    log.info(
        "record waits behind its key's retry",
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        waits_in=where,
    )


def count_dropped(metrics: ConsumerMetrics, route: Route, message: Message, run: int) -> None:
    """A redelivered record of a run a record before which failed again: dropped, as the
    retry service holds it again behind that record; counted, and logged at debug level
    (a downstream outage drops most of each run)."""
    metrics.records.labels(route.topic, "held_again").inc()
    log.debug(
        "record of a failed run dropped: it waits again behind its key's retry",
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        run=run,
    )


def check_key_order(route: Route, transactional: bool, settings: Mapping[str, Any]) -> None:
    """What key order through retries needs of the App (``settings``: its consumer's
    librdkafka settings): the tiers' lines, transactions and an assignor keeping a
    partition with its tiers; the service's per-group topic, such an assignor."""
    if route.lines_in_tiers:
        check_key_lines(route.topic, route.strategy.name, transactional, settings)
    elif route.ordering is not None and route.per_group_topic:
        check_assignor(
            route.topic,
            "per-group retry topic",
            settings,
            'Service(ordering="key", per_group_topic=False) for retries on the source',
        )
