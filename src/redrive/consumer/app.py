"""`redrive.App`: register handlers with a policy and a strategy, then run the loop.

One App is one consumer group on one confluent-kafka Consumer. The App owns the loop
(:mod:`redrive.consumer.loop`), the offsets it commits and the rebalances; each record
goes through :class:`redrive.consumer.records.Records`: its handler runs, and a failure
goes to the failure router (:mod:`redrive.router`), which decides between a retry and
a dead letter with the handler's policy. The handler's strategy
(:mod:`redrive.consumer.strategies`, one module each) says how the waiting happens:
retried in place (``blocking``, ``pause``), through retry topics (``topics``, one per
delay; ``retry-topic``, seed 000's single one) or through the retry service
(``service``).

What it commits, and what becomes of the partitions it gets and loses, is its
:class:`~redrive.consumer.assignment.Assignment`'s (only past records dealt with).

No record stops the loop: one whose headers cannot be read, or on which redrive's own
work fails (as opposed to its handler), goes to the dead letters with its raw key
and value and the reason, and the loop goes on past it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any, TypeVar, Unpack

import structlog
from confluent_kafka import (
    Consumer,
    KafkaError,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry

from redrive.client_logs import with_client_logs
from redrive.consumer.assignment import Assignment, reset_offset
from redrive.consumer.async_records import DEFAULT_MAX_IN_FLIGHT, AsyncRecords, checked_bound
from redrive.consumer.batches import (
    DEFAULT_MAX_RECORDS,
    DEFAULT_MAX_WAIT_S,
    Batches,
    BatchSettings,
    batch_settings,
)
from redrive.consumer.clients import chosen_partitioner, make_consumer, make_producer
from redrive.consumer.errors import (
    DeserializationError,
    UnprocessableRecordError,
    UnreadableHeadersError,
)
from redrive.consumer.handlers import check_handler
from redrive.consumer.held_keys import HeldKeys
from redrive.consumer.key_lines import KeyLines
from redrive.consumer.key_order import check_key_order
from redrive.consumer.loop import flush_batches, poll_once
from redrive.consumer.loop_health import loop_health, max_poll_interval_ms
from redrive.consumer.message import Message
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.metrics_server import Health, MetricsServer, check_host, check_port
from redrive.consumer.offsets import OffsetTracker
from redrive.consumer.pauses import PauseBook
from redrive.consumer.publisher import Publisher
from redrive.consumer.records import DeadLetterHook, Records, RetryHook
from redrive.consumer.repeats import DEFAULT_REPEAT_WINDOW, RecentIds, checked_window
from redrive.consumer.routes import (
    BatchHandlerOptions,
    HandlerOptions,
    Kind,
    Route,
    build_route,
)
from redrive.consumer.strategies.pause import BreakerHook, Breakers
from redrive.consumer.topics import create_derived_topics
from redrive.consumer.transactions import Transactions, transactional_id
from redrive.errors import ConfigError
from redrive.membership import fatal_group_error, static_membership
from redrive.partitioners import DEFAULT_PARTITIONER, Partitioner, PartitionerName
from redrive.rejoin import RejoinWatch
from redrive.topic_names import REQUESTS_TOPIC

__all__ = [
    "App",
    "DeserializationError",
    "HandlerOptions",
    "UnprocessableRecordError",
    "UnreadableHeadersError",
]

log = structlog.get_logger("redrive.consumer")

Handler = TypeVar("Handler", bound=Callable[..., Any])

DEFAULT_POLICY = "1s, 10s, 1m"
INSTANCE_ID_SETTING = "App(instance_id=...)"


class App:
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
        batch_size: int = 500,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        transactional: bool = False,
        partitioner: Partitioner | PartitionerName = DEFAULT_PARTITIONER,
        repeat_window: int = DEFAULT_REPEAT_WINDOW,
        commit_interval_s: float = 1.0,
        poll_timeout_s: float = 0.1,
        on_retry: RetryHook | None = None,
        on_dead_letter: DeadLetterHook | None = None,
        on_breaker: BreakerHook | None = None,
        registry: CollectorRegistry | None = None,
        metrics_port: int | None = None,
        # Loopback by default, like the retry service's HTTP port (SECURITY.md): what
        # the App exposes to the network is the user's choice. In a container the
        # scraper is elsewhere: set "0.0.0.0" there.
        metrics_host: str = "127.0.0.1",
    ) -> None:
        self.bootstrap = bootstrap or os.environ.get("REDRIVE_BOOTSTRAP", "localhost:9092")
        self.group = group
        self.kafka = dict(kafka or {})
        self.partitioner = chosen_partitioner(partitioner, self.kafka)
        self.consumer_kafka = {**static_membership(instance_id), **(consumer_kafka or {})}
        self.requests_topic = requests_topic or os.environ.get(
            "REDRIVE_REQUESTS_TOPIC", REQUESTS_TOPIC
        )
        self.batch_size = batch_size
        self.max_in_flight = checked_bound(max_in_flight)
        self.transactional = transactional
        self.repeat_window = checked_window(repeat_window)
        self._instance_id = instance_id
        self.commit_interval_s = commit_interval_s
        self.poll_timeout_s = poll_timeout_s
        self.on_retry = on_retry
        self.on_dead_letter = on_dead_letter
        self.on_breaker = on_breaker
        self.metrics = ConsumerMetrics(registry)
        self.metrics_port = check_port(metrics_port)
        self.metrics_host = check_host(metrics_host)
        self._metrics_server: MetricsServer | None = None
        # What health() judges, written by the loop's thread only.
        self._looping = False
        self._last_turn: float | None = None  # time.monotonic() the loop last polled
        self._loop_error: str | None = None
        self._assignment: Assignment | None = None
        self.routes: dict[str, Route] = {}
        self._batched: dict[str, BatchSettings] = {}
        self._batches: Batches | None = None
        self._async: AsyncRecords | None = None
        self._reads: dict[str, tuple[Route, Kind]] = {}
        self._stop = threading.Event()
        self.running = threading.Event()
        self._consumer: Consumer | None = None

    # ------------------------------------------------------------------ registration

    def handler(
        self, topic: str, **options: Unpack[HandlerOptions]
    ) -> Callable[[Handler], Handler]:
        """Decorator: handle records of ``topic`` with this policy and strategy.

        ``policy`` is a schedule (``"5s x3, 30s x2"``, ``"[10, 60]"``,
        ``"exponential 1s x2 max 1m retries 8"``) or a :class:`redrive.policy.Policy`
        (default ``"1s, 10s, 1m"``); ``strategy`` is a value carrying its own options,
        ``Blocking()``, ``Pause(breaker=...)``, ``Topics(ordering="key")``,
        ``RetryTopic()`` or ``Service(per_group_topic=True)`` (the default
        ``Service()``), or its name for the default value (``"pause"``).
        ``dead_letters`` is ``"service"`` (the retry service's store; the default with
        ``Service``) or ``"topic"`` (``<topic>.dlq``; the default otherwise). The
        handler may be ``async def`` (see :mod:`redrive.consumer.async_records`). See
        :class:`HandlerOptions` for the rest.
        """

        def register(fn: Handler) -> Handler:
            self.add_handler(topic, fn, **options)
            return fn

        return register

    def add_handler(
        self, topic: str, fn: Callable[[Message], Any], **options: Unpack[HandlerOptions]
    ) -> None:
        """The same as :meth:`handler`, without the decorator."""
        self._register(self._route(topic, fn, options))

    def _route(
        self, topic: str, fn: Callable[..., Any], options: HandlerOptions | BatchHandlerOptions
    ) -> Route:
        check_handler(topic, fn)
        if topic in self._reads:
            raise ConfigError(f"handler for {topic!r}", "registered twice")
        route = build_route(topic, fn, self.group, options, DEFAULT_POLICY)
        check_key_order(route, self.transactional, {**self.kafka, **self.consumer_kafka})
        return route

    def _register(self, route: Route) -> None:
        for name, kind in route.topics().items():
            if name in self._reads:
                raise ConfigError(f"handler for {route.topic!r}", f"topic {name!r} is already read")
            self._reads[name] = (route, kind)
        self.routes[route.topic] = route

    def batch_handler(
        self,
        topic: str,
        *,
        max_records: int = DEFAULT_MAX_RECORDS,
        max_wait: float | str = DEFAULT_MAX_WAIT_S,
        **options: Unpack[BatchHandlerOptions],
    ) -> Callable[[Handler], Handler]:
        """Decorator: handle records of ``topic`` in batches, a list of Messages a call.

        A batch holds at most ``max_records`` messages; its first record waits at most
        ``max_wait`` (seconds, or a duration such as ``"200ms"``) for more to come
        (0: a batch is what one poll returned). Raise :class:`redrive.BatchFailed`
        naming the failed records to retry or dead-letter only those; any other
        exception fails every record of the batch, each by its own policy. Strategies
        ``Topics``, ``RetryTopic`` and ``Service`` only (not those retrying in place).
        The other options are :meth:`handler`'s; see :mod:`redrive.consumer.batches`.
        """

        def register(fn: Handler) -> Handler:
            self.add_batch_handler(topic, fn, max_records=max_records, max_wait=max_wait, **options)
            return fn

        return register

    def add_batch_handler(
        self,
        topic: str,
        fn: Callable[[list[Message]], Any],
        *,
        max_records: int = DEFAULT_MAX_RECORDS,
        max_wait: float | str = DEFAULT_MAX_WAIT_S,
        **options: Unpack[BatchHandlerOptions],
    ) -> None:
        """The same as :meth:`batch_handler`, without the decorator."""
        # A route as any handler's (same checks); the loop hands it lists.
        route = self._route(topic, fn, options)
        settings = batch_settings(topic, fn, route.strategy, max_records, max_wait)
        self._register(route)
        self._batched[topic] = settings

    # ------------------------------------------------------------------ running

    def stop(self) -> None:
        """Ask the loop to finish its current record, commit and return (thread-safe)."""
        self._stop.set()

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Consume until :meth:`stop`, SIGTERM or SIGINT; commits what was dealt with.

        With ``metrics_port``, serves ``/metrics`` and ``/healthz`` from before the
        first poll until this returns (or raises): the port is closed by then."""
        if not self.routes:
            raise ConfigError("handlers", "no handler registered", "use @app.handler(topic)")
        self._looping, self._last_turn, self._loop_error = False, None, None
        if self.metrics_port is not None:
            # Before Kafka: a port in use stops start-up before anything is consumed.
            self._metrics_server = MetricsServer(
                self.metrics.registry, self.health, self.metrics_host, self.metrics_port
            )
        try:
            self._consume(install_signal_handlers)
        finally:
            if self._metrics_server is not None:
                self._metrics_server.close()
                self._metrics_server = None

    def _consume(self, install_signal_handlers: bool) -> None:
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
        # librdkafka's log lines go through structlog, not raw on stderr.
        config = with_client_logs({"bootstrap.servers": self.bootstrap, **self.kafka})
        admin = AdminClient(config)
        create_derived_topics(admin, list(self.routes.values()))
        consumer = make_consumer(config, self.consumer_kafka, self.group, self._on_commit)
        producer = make_producer(
            admin,
            config,
            self._reads,
            self.partitioner,
            transactional_id(self.group, self._instance_id) if self.transactional else None,
        )
        self._consumer = consumer
        self._producer = producer
        self._publisher = Publisher(producer, self._stop)
        self._held = HeldKeys.of(self._publisher, self.routes.values())
        self._lines = KeyLines.of(self._publisher, self.routes.values())
        self._records = Records(
            self.group,
            self._reads,
            self.requests_topic,
            self._publisher,
            self.metrics,
            self.on_retry,
            self.on_dead_letter,
            Breakers.of(
                ((r.topic, r.breaker) for r in self.routes.values()), self.metrics, self.on_breaker
            ),
            RecentIds(self.repeat_window),
            self._held,
            self.transactional,
            self._lines,
        )
        self._offsets = OffsetTracker()
        self._pauses = PauseBook(consumer)
        self._batches = Batches(self._records, self._batched) if self._batched else None
        self._async = AsyncRecords.of(
            self._records, self._offsets, self._pauses, consumer, self._reads, self.max_in_flight
        )
        self._assignment = Assignment(
            consumer,
            self._publisher,
            self._offsets,
            self._pauses,
            self._records,
            self._held,
            self._lines,
            RejoinWatch(),
            config,
            list(self._reads),
            self.group,
            reset_offset({**self.kafka, **self.consumer_kafka}),
            Transactions(producer, consumer) if self.transactional else None,
            self._batches,
            self._async,
        )
        self._assignment.subscribe((self._on_assign, self._on_revoke, self._on_lost))
        log.info("consumer started", group=self.group, topics=sorted(self._reads))
        self.running.set()
        last_commit = self._last_turn = time.monotonic()
        self._looping = True
        try:
            while not self._stop.is_set():
                turn = time.monotonic()
                if self._poll_once():  # health: a turn that could not poll does not count
                    self._last_turn = turn
                if time.monotonic() - last_commit >= self.commit_interval_s:
                    self._assignment.commit(asynchronous=True)
                    last_commit = time.monotonic()
                if self._assignment.rejoin.due(time.monotonic()):
                    self._assignment.subscribe_again()
            if self._batches is not None:  # stopping: what waits in a batch is handled
                flush_batches(self._batches, self._records, self._offsets, self.metrics)
            if self._async is not None:  # stopping: what runs may end, the rest waits
                self._async.drain(None)
        except BaseException as exc:
            self._loop_error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._looping = False
            self._shutdown()

    # ------------------------------------------------------------------ health, metrics URL

    @property
    def metrics_url(self) -> str | None:
        """``http://host:port/metrics`` while the metrics server runs, else None."""
        server = self._metrics_server
        return None if server is None else server.url("/metrics")

    @property
    def health_url(self) -> str | None:
        """``http://host:port/healthz`` while the metrics server runs, else None."""
        server = self._metrics_server
        return None if server is None else server.url("/healthz")

    def health(self, now: float | None = None) -> Health:
        """What ``/healthz`` answers (:mod:`redrive.consumer.loop_health`: the loop runs
        and polls). ``now`` is a ``time.monotonic()`` reading (tests pass a later one)."""
        assignment = self._assignment
        return loop_health(
            group=self.group,
            assigned=len(assignment.assigned) if assignment else 0,
            looping=self._looping,
            loop_error=self._loop_error,
            stopping=self._stop.is_set(),
            last_turn=self._last_turn,
            now=time.monotonic() if now is None else now,
            limit_ms=max_poll_interval_ms({**self.kafka, **self.consumer_kafka}),
        )

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        log.info("signal received; stopping", signal=signal.Signals(signum).name)
        self._stop.set()

    def _poll_once(self) -> bool:
        assert self._consumer is not None
        return poll_once(
            self._consumer,
            self._records,
            self._offsets,
            self._pauses,
            self.metrics,
            self.batch_size,
            self.poll_timeout_s,
            self._fatal,
            self._batches,
            self._async,
        )

    def _fatal(self, error: KafkaError) -> Exception:
        instance_id = self.consumer_kafka.get("group.instance.id")
        return fatal_group_error(error, self.group, instance_id, INSTANCE_ID_SETTING)

    # ------------------------------------------------------------------ commits, rebalances

    # The rebalance callbacks go through the App: what it holds is its assignment's.

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assert self._assignment is not None
        self._assignment.on_assign(consumer, partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assert self._assignment is not None
        self._assignment.on_revoke(consumer, partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assert self._assignment is not None
        self._assignment.on_lost(consumer, partitions)

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if err is None:
            self._offsets.committed([tp for tp in partitions if tp.error is None])
        elif err.code() != KafkaError._NO_OFFSET:
            log.warning("commit failed; records may be handled again", error=err.str())

    def _shutdown(self) -> None:
        consumer = self._consumer
        try:
            if self._assignment is not None:
                self._assignment.commit(asynchronous=False)
        except Exception:
            log.exception("could not commit on shutdown; records will be handled again")
        finally:
            if consumer is not None:
                consumer.close()
            if self._async is not None:
                self._async.close()
                self._async = None
            self._producer.close()
            self.running.clear()
            log.info("consumer stopped", group=self.group)
