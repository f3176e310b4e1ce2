"""Held keys: which keys of an ordered route wait in the retry service, per partition.

A route with ``ordering="key"`` keeps each key's records in order while one of them
waits for its retry: the failed record goes to the retry service as the head of its
key's queue, and every later record of that key, instead of reaching the handler,
goes behind it (``redrive-order: behind``). The service delivers the queue in order,
the head with the records waiting behind it, together: a run (``redrive-run``,
:mod:`redrive.service.store.key_queues`); the App releases each once it is done with
it (handled, or a dead letter). When a record of a run fails again, the App drops the
rest of that run: the service holds them again behind the record's new attempt. So a
held key also names the last run that failed on it, if any, and the record that failed
(:meth:`HeldKeys.dropping`): the records of that run after it are dropped.

Invariant: a key is held on a partition from the hand-off of one of its records until
the App is done with the last record of the key it handed off; while held, no record
of the key read from the partition reaches the handler, nor does a record of the run
that failed after the record that failed. What is held survives a restart and a
rebalance: every change is written to the compacted topic ``<group>.<topic>.held``
(key: the record key; value: the offset of the last record handed off, then the failed
run and the offset of the record that failed, space-separated, if there is one; a
tombstone when the key is free), at the partition of the source record, with the App's
other hand-offs (in the same transaction with ``transactional=True``); a partition's
held keys are read back from it when the partition is assigned. An App with signing
keys signs each of those records and ignores, reading back, any that does not verify
where it was read (:mod:`redrive.consumer.bookkeeping`).

Cost: memory for one entry per held key (the key's bytes, an offset, maybe a failed run);
the held topic holds one record per key held (compaction drops the rest).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import structlog
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from redrive.consumer.bookkeeping import BookkeepingCheck
from redrive.consumer.offsets import Partition
from redrive.consumer.publisher import Publisher

if TYPE_CHECKING:
    from redrive.consumer.routes import Route

log = structlog.get_logger("redrive.consumer")

LOAD_TIMEOUT_S = 60.0


class FailedRun(NamedTuple):
    """A run of a key's queue a record of which failed again: the records of the run
    after that record are the service's again (earlier ones were handled before it, and
    are handled again if read again: their releases may not have been written)."""

    run: int
    offset: int
    """The original offset of the record that failed."""


class HeldKeys:
    """The held keys of the partitions of ordered routes this App owns (see the module)."""

    @classmethod
    def of(
        cls, publisher: Publisher, routes: Iterable[Route], check: BookkeepingCheck | None = None
    ) -> HeldKeys:
        """For the routes that keep key order in the retry service."""
        ordered = [r for r in routes if r.ordering is not None and not r.lines_in_tiers]
        return cls(publisher, {r.topic: r.held_topic for r in ordered}, check)

    def __init__(
        self,
        publisher: Publisher,
        held_topics: Mapping[str, str],
        check: BookkeepingCheck | None = None,
    ) -> None:
        self.publisher = publisher
        self.check = check
        """What a record read back must pass (None: believed, as without keys)."""
        self.held_topics = dict(held_topics)
        """Ordered route topic -> its held-keys topic."""
        self.by_partition: dict[Partition, dict[bytes, int]] = {}
        """The held keys and the offsets of their last records handed off."""
        self.failed_runs: dict[Partition, dict[bytes, FailedRun]] = {}
        """The held keys whose last run failed, and where."""

    def last(self, topic: str, partition: int, key: bytes) -> int | None:
        """The offset of the last record of ``key`` handed off, while the key is held."""
        held = self.by_partition.get((topic, partition))
        return None if held is None else held.get(key)

    def dropping(self, topic: str, partition: int, key: bytes) -> FailedRun | None:
        """The run of ``key``'s queue a record of which failed again, and where: the rest
        of it is dropped, held again by the service behind that record."""
        runs = self.failed_runs.get((topic, partition))
        return None if runs is None else runs.get(key)

    def hold(
        self, topic: str, partition: int, key: bytes, offset: int, run: int | None = None
    ) -> None:
        """A record of ``key`` at ``offset`` was handed off (a retry, or behind one);
        ``run``: the run it was delivered in, when it failed again."""
        where = (topic, partition)
        held = self.by_partition.setdefault(where, {})
        runs = self.failed_runs.setdefault(where, {})
        last, failed = held.get(key), runs.get(key)
        now = None if run is None else FailedRun(run, offset)
        if (last is None or offset > last) or (now is not None and now != failed):
            # Not a later attempt of a record already held, nor one read again.
            held[key] = offset if last is None else max(last, offset)
            if now is not None:
                runs[key] = failed = now
            self._write(where, key, held[key], failed)

    def done(self, topic: str, partition: int, key: bytes, offset: int) -> bool:
        """The App is done with the handed-off record of ``key`` at ``offset``: if it was
        the last, the key is free (True)."""
        held = self.by_partition.get((topic, partition))
        last = None if held is None else held.get(key)
        if held is None or last is None or last > offset:
            return False
        del held[key]
        self.failed_runs.get((topic, partition), {}).pop(key, None)
        self.publisher.put(self.held_topics[topic], key=key, value=None, partition=partition)
        return True

    def _write(self, where: Partition, key: bytes, last: int, failed: FailedRun | None) -> None:
        topic, partition = where
        self.publisher.put(
            self.held_topics[topic], key=key, value=held_value(last, failed), partition=partition
        )

    def count(self, topic: str) -> int:
        return sum(len(keys) for (t, _), keys in self.by_partition.items() if t == topic)

    def forget(self, partitions: Iterable[Partition]) -> None:
        """Partitions leave this App: their next owner reads their held keys back."""
        for partition in partitions:
            self.by_partition.pop(partition, None)
            self.failed_runs.pop(partition, None)

    def load(self, config: Mapping[str, Any], partitions: Iterable[Partition]) -> None:
        """Read back the held keys of newly assigned partitions of ordered routes."""
        found = read_back(config, self.held_topics, partitions, self.check)
        for partition, values in found.items():
            keys: dict[bytes, int] = {}
            runs: dict[bytes, FailedRun] = {}
            for key, value in values.items():
                try:
                    last, failed = parse_held(value)
                except ValueError:
                    log.warning(
                        "held-keys record not an offset (and a failed run); skipped",
                        topic=self.held_topics[partition[0]],
                        partition=partition[1],
                    )
                    continue
                keys[key] = last
                if failed is not None:
                    runs[key] = failed
            self.by_partition[partition] = keys
            self.failed_runs[partition] = runs


def held_value(last: int, failed: FailedRun | None) -> bytes:
    """A held key's record value: the offset of its last record handed off, then the
    failed run and the offset of the record that failed, space-separated, if any."""
    if failed is None:
        return str(last).encode()
    return f"{last} {failed.run} {failed.offset}".encode()


def parse_held(value: bytes) -> tuple[int, FailedRun | None]:
    """:func:`held_value` read back (ValueError: not one)."""
    parts = value.split(b" ")
    if len(parts) not in (1, 3) or not all(part.isdigit() for part in parts):
        raise ValueError(f"not an offset, or an offset, a run and an offset: {value!r}")
    numbers = [int(part) for part in parts]
    return numbers[0], (FailedRun(numbers[1], numbers[2]) if len(numbers) == 3 else None)


def read_back(
    config: Mapping[str, Any],
    held_topics: Mapping[str, str],
    partitions: Iterable[Partition],
    check: BookkeepingCheck | None = None,
) -> dict[Partition, dict[bytes, bytes]]:
    """The last value of each key in the held-keys topic partitions of the newly
    assigned partitions of ordered routes (``held_topics``: route topic -> its held-keys
    topic), read from start to end; committed records only (a hand-off of a
    transaction that did not commit did not happen), and of those only the ones
    ``check`` believes (an ignored record, a tombstone too, leaves its key as it was)."""
    wanted = [(t, p) for t, p in partitions if t in held_topics]
    if not wanted:
        return {}
    reader = Consumer(
        {
            **config,
            "group.id": "redrive-held-keys-reader",  # assigned, never committed
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    try:
        route_of = {held: route for route, held in held_topics.items()}

        def believed(msg: Message) -> bool:
            return check is None or check.believed(msg, route_of[str(msg.topic())])

        found = _read_to_end(
            reader,
            [TopicPartition(held_topics[t], p, OFFSET_BEGINNING) for t, p in wanted],
            believed,
        )
    finally:
        reader.close()
    by_held = {(held_topics[t], p): (t, p) for t, p in wanted}
    values = {by_held[where]: keys for where, keys in found.items()}
    log.info(
        "held keys read back",
        partitions=[f"{t}[{p}]" for t, p in wanted],
        held=sum(len(keys) for keys in values.values()),
    )
    return values


def _read_to_end(
    reader: Consumer, partitions: list[TopicPartition], believed: Callable[[Message], bool]
) -> dict[tuple[str, int], dict[bytes, bytes]]:
    """Each partition's keys and last values, read from its start to its end."""
    found: dict[tuple[str, int], dict[bytes, bytes]] = {
        (tp.topic, tp.partition): {} for tp in partitions
    }
    open_ = set(found)
    reader.assign(partitions)
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while open_:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"held keys not read back within {LOAD_TIMEOUT_S:.0f} s: {sorted(open_)}"
            )
        for msg in reader.consume(500, 0.5):
            where = (str(msg.topic()), int(msg.partition() or 0))
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    open_.discard(where)
                    continue
                raise KafkaException(error)
            key, value = msg.key(), msg.value()
            if key is None or not believed(msg):
                continue
            keys = found[where]
            if value is None:
                keys.pop(key, None)
            else:
                keys[key] = value
    return found
