"""`redrive.App`: register handlers with a policy and a strategy, then run the loop.

One App is one consumer group on one confluent-kafka Consumer. Registering checks
each route whole (:mod:`redrive.consumer.registry`); :meth:`App.run` opens a
:class:`~redrive.consumer.session.Session` (the clients, the per-record pipeline,
offsets, pauses, the assignment) and turns the loop (:mod:`redrive.consumer.loop`)
until it is stopped. Each record goes through the pipeline of its route
(:mod:`redrive.consumer.pipeline`): its handler runs, and a failure goes to the
failure router (:mod:`redrive.router`), which decides between a retry and a dead
letter with the handler's policy. The handler's strategy
(:mod:`redrive.consumer.strategies`, one module each) says how the waiting happens:
retried in place (``Blocking``, ``Pause``), through retry topics (``Topics``, one
per delay; ``RetryTopic``, a single one) or through the retry service (``Service``).

What it commits, and what becomes of the partitions it gets and loses, is its
:class:`~redrive.consumer.assignment.Assignment`'s (only past records dealt with).

No record stops the loop: one whose headers cannot be read, or on which redrive's own
work fails (as opposed to its handler), goes to the dead letters with its raw key
and value and the reason, and the loop goes on past it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry

from redrive.consumer.async_records import DEFAULT_MAX_IN_FLIGHT, checked_bound
from redrive.consumer.errors import (
    DeserializationError,
    UnprocessableRecordError,
    UnreadableHeadersError,
)
from redrive.consumer.loop_health import max_poll_interval_ms
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.metrics_server import Health
from redrive.consumer.refusals import DEFAULT_RULE, ReturnRule
from redrive.consumer.registry import Registry
from redrive.consumer.repeats import DEFAULT_REPEAT_WINDOW
from redrive.consumer.routes import (
    HandlerOptions,
)
from redrive.consumer.running import Running
from redrive.consumer.session import Session
from redrive.consumer.settings import AppSettings, DeadLetterHook, Hooks, Polling, RetryHook
from redrive.consumer.strategies.pause import BreakerHook
from redrive.partitioners import DEFAULT_PARTITIONER, Partitioner, PartitionerName
from redrive.signing import KeyRing

__all__ = [
    "App",
    "DeserializationError",
    "HandlerOptions",
    "UnprocessableRecordError",
    "UnreadableHeadersError",
]

log = structlog.get_logger("redrive.consumer")


class App(Registry, Running):
    """A Kafka consumer whose failed records come back when due.

    ``bootstrap`` defaults to REDRIVE_BOOTSTRAP, else ``localhost:9092``. ``kafka``
    adds librdkafka settings to the consumer and producer alike (security.protocol,
    sasl.*, ssl.*...); ``consumer_kafka`` to the consumer only (fetch sizes, queue
    depths: the producer would warn about those). ``requests_topic`` is the retry
    service's (strategy ``service``), by default REDRIVE_REQUESTS_TOPIC, else
    ``redrive.requests``, as for the service.

    ``instance_id`` makes the App a static member of its group (``group.instance.id``):
    restarted after a crash, it takes its partitions back at once instead of after the
    broker's session timeout (45 s by default). It must be stable across restarts of
    one instance and differ between instances (a pod name in a StatefulSet, a host
    name): two running Apps with one id stop the older with a ConfigError.

    ``metrics_port`` serves, while :meth:`run` runs, ``/metrics`` (the Prometheus
    exposition of ``app.metrics.registry``) and ``/healthz`` (200 while the loop is
    healthy, else 503; see :meth:`health`) on ``metrics_host``; 0 takes any free port
    (:attr:`metrics_url` says which). A port in use stops :meth:`run` with a
    ConfigError before anything is consumed.

    ``transactional=True`` makes each commit one Kafka transaction with the hand-offs
    (retries, dead letters) since the previous one: a crash never hands a failure off
    twice (see :mod:`redrive.consumer.transactions`). With ``instance_id``, the
    ``transactional.id`` is stable across restarts.

    ``partitioner`` places what the App writes without a partition (retry requests,
    dead letters) by key: ``"murmur2_random"``, the Java producer's placement, unless
    told otherwise (:class:`redrive.partitioners.Partitioner`; not in ``kafka``).

    ``repeat_window``: how many ``redrive-id`` of redelivered records handled lately
    the App remembers, to skip a repeat delivery of one (0: none); see
    :mod:`redrive.consumer.repeats`.

    ``signing``: the keys (:class:`redrive.signing.KeyRing`, e.g.
    ``KeyRing.from_settings(["k1=<base64 secret>"])``) the App signs everything it
    writes with (``redrive-signature``: docs/signing.md), and verifies every record
    that comes back to it with (tiers, the single retry topic, the per-group topic,
    deliveries on its topics); by default REDRIVE_SIGNING_KEYS and
    REDRIVE_SIGNING_KEY_FILES, else unsigned.

    ``returns``: what becomes of a record on a retry path whose redrive headers the
    App cannot believe (:mod:`redrive.consumer.refusals`): ``RefuseToDeadLetters()``
    (the default: a dead letter saying why) or ``RefuseAndCount()`` (counted, logged,
    dropped); either with ``trust_unsigned=True`` while signing is rolled out. On a
    source topic such a record is handled as a new record, whatever the rule.

    ``max_poll_records``: the most records one poll takes (Kafka's
    ``max.poll.records``); the loop deals with them before it polls again.

    ``max_in_flight`` bounds the records of ``async def`` handlers accepted and not
    dealt with yet (running, or waiting for an earlier record of their key or
    partition); see :mod:`redrive.consumer.async_records`.

    ``on_retry(message, retry, error)`` and ``on_dead_letter(message, dead, error)`` are
    called for each decision, ``on_breaker(topic, old_state, new_state)`` on each
    transition of a ``pause`` handler's circuit breaker
    (:class:`redrive.consumer.breaker.BreakerState`); a hook that raises is logged.
    """

    def __init__(
        self,
        bootstrap: str | None = None,
        group: str = "redrive-app",
        *,
        kafka: Mapping[str, Any] | None = None,
        consumer_kafka: Mapping[str, Any] | None = None,
        instance_id: str | None = None,
        requests_topic: str | None = None,
        max_poll_records: int = 500,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        transactional: bool = False,
        partitioner: Partitioner | PartitionerName = DEFAULT_PARTITIONER,
        repeat_window: int = DEFAULT_REPEAT_WINDOW,
        commit_interval_s: float = 1.0,
        poll_timeout_s: float = 0.1,
        on_retry: RetryHook | None = None,
        on_dead_letter: DeadLetterHook | None = None,
        on_breaker: BreakerHook | None = None,
        signing: KeyRing | None = None,
        returns: ReturnRule = DEFAULT_RULE,
        registry: CollectorRegistry | None = None,
        metrics_port: int | None = None,
        # Loopback by default, like the retry service's HTTP port (SECURITY.md): what
        # the App exposes to the network is the user's choice. In a container the
        # scraper is elsewhere: set "0.0.0.0" there.
        metrics_host: str = "127.0.0.1",
    ) -> None:
        settings = AppSettings.of(
            bootstrap,
            group,
            kafka=kafka,
            consumer_kafka=consumer_kafka,
            instance_id=instance_id,
            requests_topic=requests_topic,
            partitioner=partitioner,
            transactional=transactional,
            repeat_window=repeat_window,
            polling=Polling(
                max_poll_records, poll_timeout_s, commit_interval_s, checked_bound(max_in_flight)
            ),
            hooks=Hooks(on_retry, on_dead_letter, on_breaker),
            signing=signing,
            returns=returns,
        )
        Registry.__init__(self, settings)
        Running.__init__(self, ConsumerMetrics(registry), metrics_port, metrics_host)
        self._session: Session | None = None

    # ------------------------------------------------------------------ running

    def _consume(self) -> None:
        session = Session(
            self.settings, self.routes, self._reads, self._batched, self.metrics, self._stop
        )
        self._session = session
        # Through the App's methods, looked up now: what watches rebalances wraps them.
        session.subscribe((self._on_assign, self._on_revoke, self._on_lost))
        log.info("consumer started", group=self.group, topics=sorted(self._reads))
        try:
            self._loop(self._poll_once, session.upkeep)
            session.finish()
        finally:
            self._shutdown()

    def health(self, now: float | None = None) -> Health:
        """What ``/healthz`` answers: the loop's health (:meth:`Running.health`), and
        the dead-letter brakes, if any: a brake not closed makes a healthy App
        ``degraded`` (still 200; see :meth:`redrive.consumer.brakes.Brakes.degrade`)."""
        verdict = super().health(now)
        session = self._session
        return verdict if session is None else session.brakes.degrade(verdict)

    def _assigned(self) -> int:
        session = self._session
        return len(session.assignment.assigned) if session else 0

    def _poll_limit_ms(self) -> float:
        return max_poll_interval_ms(self.settings.consumer_config)

    def _poll_once(self) -> bool:
        assert self._session is not None
        return self._session.turn()

    # ------------------------------------------------------------------ commits, rebalances

    # The rebalance callbacks go through the App: what it holds is its assignment's.

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assert self._session is not None
        self._session.assignment.on_assign(consumer, partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assert self._session is not None
        self._session.assignment.on_revoke(consumer, partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assert self._session is not None
        self._session.assignment.on_lost(consumer, partitions)

    def _shutdown(self) -> None:
        session = self._session
        try:
            if session is not None:
                session.close()
        finally:
            self.running.clear()
            log.info("consumer stopped", group=self.group)
