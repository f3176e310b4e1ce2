"""One requests group, one store: a service refuses a group that reads into another.

Intake reads the requests topic in a consumer group and stores what it reads in its
PostgreSQL database. Two services on two databases with the same requests topic and
group would split the partitions between them: each database would get part of the
requests, and neither service would know. Several services on one database share a
group on purpose (scaling out), and keep doing so.

So intake names its store in the metadata of every offset it commits, and reads
those names (:mod:`redrive.service.group_marks`) for the group:

- at start-up (:meth:`StoreGuard.check`), before the service joins the group or
  stores anything: a service started next to a running one on another database
  stops there, and the running one is not even disturbed by a rebalance;
- whenever partitions are assigned (:meth:`StoreGuard.on_assign`), before any of
  their records is read: this takes a group no store holds yet (a fresh one, or one
  an older redrive committed for), and catches a service that started at the same
  moment as another on a fresh group.

A group read into another store stops the service with a ConfigError naming the
settings (`database_url`, `group_id`, `requests_topic`); it stores nothing of it.

The requests topic's partitions are read by an admin client made for each check, never
by the consumer whose rebalance callback runs the check: confluent-kafka keeps one
call state per client and thread, and a metadata call on the consumer inside its own
callback clears the state of the poll that runs the callback, so the next callback
of that poll (a log line, say) aborts the process. What the guard does on the
consumer (committed offsets, watermarks, commits, assign, pause, resume) leaves that
state alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from contextlib import closing
from datetime import UTC, datetime
from typing import Any, Final

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from redrive.clock import now_ms
from redrive.errors import ConfigError
from redrive.schedules import backoff_delay
from redrive.service import group_marks
from redrive.service.config import ServiceSettings
from redrive.service.group_marks import Mark, OtherStore, Partition

log = structlog.get_logger("redrive.store_guard")

SETTINGS: Final = (
    "database_url, group_id, requests_topic "
    "(REDRIVE_DATABASE_URL, REDRIVE_GROUP_ID, REDRIVE_REQUESTS_TOPIC)"
)
START_TIMEOUT_S: Final = 30.0
"""At start-up, as long as the service waits for its broker elsewhere."""
_CALL_TIMEOUT_S: Final = 10.0
# The assignment being checked is over: a new one follows, checked in its turn.
_ASSIGNMENT_OVER: Final = frozenset(
    {
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError._ASSIGNMENT_LOST,
    }
)


class StoreGuard:
    """Keeps intake from reading its requests group into a store the group does not
    read into. ``mark`` is the metadata of intake's commits; ``kafka_config`` is the
    service's client configuration (broker, security, logging), not intake's own."""

    def __init__(
        self,
        settings: ServiceSettings,
        store: str,
        database: str,
        stop: threading.Event,
        kafka_config: Mapping[str, Any],
    ) -> None:
        self.store = store
        self.group = settings.group_id
        self.topic = settings.requests_topic
        self.database = database  # for the error, without its password
        self.stop = stop
        self.mark = group_marks.settled(store)
        self.kafka_config = dict(kafka_config)
        consumer_config = {**settings.kafka, **settings.intake_kafka}
        reset = str(consumer_config.get("auto.offset.reset", "earliest"))
        # Where a partition with no committed offset starts (intake's own setting):
        # a claim commits that very position, so the claim moves nothing.
        self._from_end = reset in ("latest", "largest", "end")
        # Cooperative rebalancing hands over the partitions added, to add to the rest.
        strategy = str(consumer_config.get("partition.assignment.strategy", ""))
        self._incremental = "cooperative" in strategy or (
            str(consumer_config.get("group.protocol", "")) == "consumer"
        )

    def check(self) -> None:
        """At start-up: raise a ConfigError if the group reads into another store."""
        with closing(_Metadata(self.kafka_config)) as metadata:
            consumer = Consumer(
                {**self.kafka_config, "group.id": self.group, "enable.auto.commit": False}
            )
            deadline = time.monotonic() + START_TIMEOUT_S
            attempt = 0
            try:
                while True:
                    try:
                        marks, _ = self._read(consumer, metadata, [], _CALL_TIMEOUT_S)
                        break
                    except KafkaException as exc:
                        # A broker just started answers NOT_COORDINATOR for a while.
                        attempt += 1
                        if time.monotonic() > deadline:
                            raise ConfigError(
                                "bootstrap (REDRIVE_BOOTSTRAP)",
                                f"cannot read the committed offsets of consumer group "
                                f"{self.group!r} within {START_TIMEOUT_S:.0f} s: {exc}",
                                "check that the broker is reachable and the kafka settings "
                                "are right",
                            ) from None
                        time.sleep(backoff_delay(attempt, 0.2, 2.0))
            finally:
                consumer.close()
        other = group_marks.other_store(marks, self.store, now_ms())
        if other is not None:
            raise self._refused(other)
        log.info(
            "consumer group checked",
            group=self.group,
            topic=self.topic,
            store=self.store,
            held=group_marks.held_by(marks, self.store),
        )

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """The consumer's rebalance callback: check (and take) the group before any
        record of `partitions` is read; raise a ConfigError if it reads into another
        store. The partitions are assigned here, paused if the check could not end.

        While the broker does not answer (a broker restarting), it tries again, for as
        long as that lasts: intake reads nothing meanwhile, as it could not without the
        broker. Blocked past max.poll.interval.ms, the consumer leaves the group, and
        rejoins once this returns: its next assignment is checked in its turn."""
        with closing(_Metadata(self.kafka_config)) as metadata:
            attempt = 0
            while True:
                try:
                    self._take(consumer, metadata, partitions)
                    break
                except KafkaException as exc:
                    error = _error_of(exc)
                    if error.code() in _ASSIGNMENT_OVER:
                        log.info(
                            "assignment ended while checked; the next one is", error=error.str()
                        )
                        self._hold(consumer, partitions)
                        return
                    attempt += 1
                    log.warning(
                        "cannot check the consumer group; trying again",
                        error=error.str(),
                        attempt=attempt,
                    )
                    if self.stop.wait(backoff_delay(attempt, 0.2, 5.0)):
                        self._hold(consumer, partitions)  # stopping: nothing more is read
                        return
        self._assign(consumer, partitions)
        # An earlier assignment's check may have ended with them paused (_hold).
        consumer.resume(partitions)

    def _take(
        self, consumer: Consumer, metadata: _Metadata, partitions: list[TopicPartition]
    ) -> None:
        """Check the group's marks; if no store holds it, claim and settle the assigned
        partitions (group_marks' two steps); raise if another store holds it."""
        mine = sorted({(tp.topic, tp.partition) for tp in partitions})
        marks, offsets = self._read(consumer, metadata, mine, _CALL_TIMEOUT_S)
        other = group_marks.other_store(marks, self.store, now_ms())
        if other is not None:
            raise self._refused(other)
        if group_marks.held_by(marks, self.store):
            unsettled = [p for p in mine if marks.get(p) != Mark(self.store)]
            self._write(consumer, {p: offsets[p] for p in unsettled}, self.mark)
            return
        if not mine:
            return  # nothing to read, so nothing to claim
        self._write(consumer, offsets, group_marks.claim(self.store, now_ms()))
        marks, _ = self._read(consumer, metadata, mine, _CALL_TIMEOUT_S)
        other = group_marks.other_store(marks, self.store, now_ms())
        if other is not None:
            self._take_back(consumer, offsets)
            raise self._refused(other)
        self._write(consumer, offsets, self.mark)
        log.info(
            "consumer group taken for this store",
            group=self.group,
            topic=self.topic,
            store=self.store,
            partitions=_names(mine),
        )

    def _read(
        self,
        consumer: Consumer,
        metadata: _Metadata,
        mine: Iterable[Partition],
        timeout_s: float,
    ) -> tuple[dict[Partition, Mark | None], dict[Partition, int]]:
        """The marks of the requests topic's partitions and of `mine`; and where each
        of `mine` starts (its committed offset, else where intake would start it).

        The partitions come from `metadata`, not from `consumer`: this runs inside the
        consumer's rebalance callback (see the module's docstring)."""
        wanted = {(self.topic, p) for p in metadata.partitions(self.topic, timeout_s)} | set(mine)
        asked = [TopicPartition(t, p) for t, p in sorted(wanted)]
        committed = consumer.committed(asked, timeout=timeout_s)
        marks: dict[Partition, Mark | None] = {}
        offsets: dict[Partition, int] = {}
        for tp in committed:
            if tp.error is not None:
                raise KafkaException(tp.error)
            marks[(tp.topic, tp.partition)] = group_marks.read(tp.metadata)
            offsets[(tp.topic, tp.partition)] = tp.offset
        return marks, {p: self._start_of(consumer, p, offsets[p]) for p in mine}

    def _start_of(self, consumer: Consumer, partition: Partition, committed: int) -> int:
        if committed >= 0:
            return committed
        low, high = consumer.get_watermark_offsets(
            TopicPartition(*partition), timeout=_CALL_TIMEOUT_S
        )
        return high if self._from_end else low

    def _write(self, consumer: Consumer, offsets: Mapping[Partition, int], metadata: str) -> None:
        """Commit `offsets` as they are, with `metadata`: a mark, moving no position."""
        if not offsets:
            return
        wanted = [TopicPartition(t, p, o, metadata=metadata) for (t, p), o in offsets.items()]
        result = consumer.commit(offsets=wanted, asynchronous=False) or []
        for tp in result:
            if tp.error is not None:
                raise KafkaException(tp.error)

    def _take_back(self, consumer: Consumer, offsets: Mapping[Partition, int]) -> None:
        """Take this store's claims back (the other store may then go on). Failing, the
        claims lapse after group_marks.CLAIM_EXPIRY_MS."""
        try:
            self._write(consumer, offsets, "")
        except KafkaException as exc:
            log.warning("claims not taken back; they lapse by themselves", error=str(exc))

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._incremental:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)

    def _hold(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Assign the partitions paused: none of their records is read."""
        self._assign(consumer, partitions)
        consumer.pause(partitions)

    def _refused(self, other: OtherStore) -> ConfigError:
        where = _names(other.partitions)
        if other.settled:
            problem = (
                f"consumer group {self.group!r} already reads requests topic {self.topic!r} "
                f"into another store: its committed offsets name store {other.store} "
                f"({where}), and this service's database ({self.database}) is store "
                f"{self.store}. Two stores on one group would each get part of the "
                "requests, and neither all of them"
            )
        else:
            assert other.claimed_ms is not None
            lapses = datetime.fromtimestamp(
                (other.claimed_ms + group_marks.CLAIM_EXPIRY_MS) / 1000, UTC
            )
            problem = (
                f"a service on another store ({other.store}) is taking consumer group "
                f"{self.group!r} on requests topic {self.topic!r} at this moment ({where}); "
                f"this service's database ({self.database}) is store {self.store}. Two "
                "stores on one group would each get part of the requests (if no service "
                "of that store is starting, its claim was left behind, and lapses at "
                f"{lapses:%Y-%m-%d %H:%M:%S} UTC)"
            )
        log.error(
            "consumer group reads into another store; this service refuses it",
            group=self.group,
            topic=self.topic,
            store=self.store,
            other_store=other.store,
            other_settled=other.settled,
            partitions=where,
        )
        fix = (
            f"to share the work of the services on store {other.store}, set database_url "
            "to their database; to run a service of its own, give it a requests_topic "
            "and a group_id of its own (and point its senders at that topic)"
        )
        if other.settled:
            # The way to start a store over on a new database, stated on purpose.
            fix += (
                f"; if store {other.store} is retired and this database replaces it, "
                f"give this database its identity (with its services stopped): UPDATE "
                f"redrive_store SET store_id = '{other.store}'"
            )
        return ConfigError(SETTINGS, problem, fix)


class _Metadata:
    """Reads topic metadata through an admin client of its own, for one check (see the
    module's docstring), until closed. Closing destroys the client at once, also while
    an exception raised by the check still holds this object."""

    def __init__(self, kafka_config: Mapping[str, Any]) -> None:
        self._client: AdminClient | None = AdminClient(dict(kafka_config))

    def partitions(self, topic: str, timeout_s: float) -> list[int]:
        """The partitions of `topic`; raises a KafkaException if it cannot tell."""
        assert self._client is not None, "closed"
        try:
            found = self._client.list_topics(topic, timeout=timeout_s).topics.get(topic)
        finally:
            self._client.poll(0)  # the client's own log lines, if any
        if found is None or found.error is not None:
            raise KafkaException(found.error if found else KafkaError(KafkaError._UNKNOWN_TOPIC))
        return list(found.partitions)

    def close(self) -> None:
        self._client = None  # its only reference: destroyed now


def _error_of(exc: KafkaException) -> KafkaError:
    first = exc.args[0] if exc.args else None
    return first if isinstance(first, KafkaError) else KafkaError(KafkaError._FAIL, str(exc))


def _names(partitions: Iterable[Partition]) -> str:
    """`topic` partitions 0, 1, 2; ..., for messages."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return "; ".join(
        f"{topic} partition{'s' if len(ps) > 1 else ''} {', '.join(map(str, ps))}"
        for topic, ps in by_topic.items()
    )
