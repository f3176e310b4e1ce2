"""`redrive.ShareApp`: handlers with a policy on a Kafka share group (KIP-932).

Several consumers share one partition's records: the broker hands each record to one
of them, locked for ``share.record.lock.duration.ms``, and counts its deliveries. What
a share group lacks, redrive adds: a policy (which errors to retry, how often, until
when), retries that come back when due (a retry due now is released to the group; a
later one goes through the retry service, which delivers it when due) and dead letters
with their key and value in the retry service's store, to search, replay and delete.
How each outcome is acknowledged: :mod:`redrive.consumer.share.settle`; one poll's
way: :mod:`redrive.consumer.share.turns`.

The attempt a handler sees (``message.attempt``) counts the broker's deliveries of the
record, after the failures redrive counted before it handed the record off
(``message.delivery_count`` is the broker's count alone).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, Unpack, cast

import structlog
from confluent_kafka import KafkaError, ShareConsumer
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry

from redrive.client_logs import with_client_logs
from redrive.consumer.clients import chosen_partitioner, make_producer
from redrive.consumer.handlers import check_handler
from redrive.consumer.loop_health import max_poll_interval_ms
from redrive.consumer.message import Message
from redrive.consumer.outcomes import Outcomes
from redrive.consumer.pipeline import Pipeline
from redrive.consumer.publisher import Publisher
from redrive.consumer.repeats import DEFAULT_REPEAT_WINDOW, RecentIds, checked_window
from redrive.consumer.routes import HandlerOptions, Kind, Route, RouteOptions, build_route
from redrive.consumer.running import Running
from redrive.consumer.settings import DeadLetterHook, Hooks, RetryHook
from redrive.consumer.share.group_terms import read_terms
from redrive.consumer.share.metrics import ShareMetrics
from redrive.consumer.share.settle import Settler
from redrive.consumer.share.turns import Turns
from redrive.consumer.steps import KeyOrders, build_steps
from redrive.consumer.strategies import Service
from redrive.consumer.strategies.pause import Breakers
from redrive.consumer.topics import create_derived_topics
from redrive.errors import ConfigError
from redrive.membership import fatal_group_error
from redrive.partitioners import DEFAULT_PARTITIONER, Partitioner, PartitionerName
from redrive.topic_names import REQUESTS_TOPIC

log = structlog.get_logger("redrive.share")

Handler = TypeVar("Handler", bound=Callable[..., Any])

DEFAULT_POLICY = "0s, 1s, 10s"


class ShareHandlerOptions(RouteOptions, total=False):
    """Options of :meth:`ShareApp.handler`: the policy's, and where retries come back."""

    per_group_topic: bool
    """Retries due later come back on ``<group>.<topic>.retry`` (read by the group too)
    rather than on ``<topic>``, where every other group reading it would see them."""


class ShareApp(Running):
    """A share-group consumer whose failed records come back when due (see the module).

    ``kafka`` adds librdkafka settings to the share consumer and the producer alike;
    ``consumer_kafka`` to the share consumer only. ``requests_topic``, ``partitioner``,
    ``repeat_window``, ``on_retry``, ``on_dead_letter``, ``metrics_port`` and
    ``metrics_host`` are :class:`redrive.App`'s. Where a share group starts reading a
    topic is the group's own setting (``share.auto.offset.reset``, ``latest`` unless
    set: see docs/share-groups.md).
    """

    def __init__(
        self,
        bootstrap: str | None = None,
        group: str = "redrive-share",
        *,
        kafka: Mapping[str, Any] | None = None,
        consumer_kafka: Mapping[str, Any] | None = None,
        requests_topic: str | None = None,
        partitioner: Partitioner | PartitionerName = DEFAULT_PARTITIONER,
        repeat_window: int = DEFAULT_REPEAT_WINDOW,
        poll_timeout_s: float = 0.1,
        on_retry: RetryHook | None = None,
        on_dead_letter: DeadLetterHook | None = None,
        registry: CollectorRegistry | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
    ) -> None:
        self.bootstrap = bootstrap or os.environ.get("REDRIVE_BOOTSTRAP", "localhost:9092")
        self._group = group
        self.kafka = dict(kafka or {})
        self.consumer_kafka = dict(consumer_kafka or {})
        self.requests_topic = requests_topic or os.environ.get(
            "REDRIVE_REQUESTS_TOPIC", REQUESTS_TOPIC
        )
        self.partitioner = chosen_partitioner(partitioner, self.kafka)
        self.repeat_window = checked_window(repeat_window)
        self.poll_timeout_s = poll_timeout_s
        self.hooks = Hooks(on_retry, on_dead_letter)
        self.share_metrics = ShareMetrics(registry)
        super().__init__(self.share_metrics, metrics_port, metrics_host)
        self.routes: dict[str, Route] = {}
        self._reads: dict[str, tuple[Route, Kind]] = {}
        self._turns: Turns | None = None

    @property
    def group(self) -> str:
        return self._group

    # ------------------------------------------------------------------ registration

    def handler(
        self, topic: str, **options: Unpack[ShareHandlerOptions]
    ) -> Callable[[Handler], Handler]:
        """Decorator: handle records of ``topic`` with this policy (default
        ``"0s, 1s, 10s"``: once again at once, then through the retry service). The
        handler may be ``async def``. Dead letters go to the retry service's store
        unless ``dead_letters="topic"`` (``<topic>.dlq``)."""

        def register(fn: Handler) -> Handler:
            self.add_handler(topic, fn, **options)
            return fn

        return register

    def add_handler(
        self, topic: str, fn: Callable[[Message], Any], **options: Unpack[ShareHandlerOptions]
    ) -> None:
        """The same as :meth:`handler`, without the decorator."""
        check_handler(topic, fn)
        if topic in self._reads:
            raise ConfigError(f"handler for {topic!r}", "registered twice")
        per_group = bool(options.get("per_group_topic", False))
        given = {k: v for k, v in options.items() if k != "per_group_topic"}
        route_options = cast(HandlerOptions, given)
        route_options["strategy"] = Service(per_group_topic=per_group)
        route = build_route(topic, fn, self.group, route_options, DEFAULT_POLICY)
        for name, kind in route.topics().items():
            if name in self._reads:
                raise ConfigError(f"handler for {topic!r}", f"topic {name!r} is already read")
            self._reads[name] = (route, kind)
        self.routes[topic] = route

    # ------------------------------------------------------------------ running

    def _check_ready(self) -> None:
        if not self.routes:
            raise ConfigError("handlers", "no handler registered", "use @app.handler(topic)")

    def _consume(self) -> None:
        config = with_client_logs({"bootstrap.servers": self.bootstrap, **self.kafka})
        admin = AdminClient(config)
        create_derived_topics(admin, list(self.routes.values()))
        terms = read_terms(admin, self.group)
        producer = make_producer(admin, config, self._reads, self.partitioner)
        publisher = Publisher(producer, self._stop)
        outcomes = Outcomes(
            self.group,
            self.requests_topic,
            publisher,
            self.metrics,
            self.hooks,
            RecentIds(self.repeat_window),
            transactional=False,
        )
        steps = build_steps(self.routes.values(), KeyOrders(None, None), Breakers())
        pipeline = Pipeline(self.group, self._reads, steps, outcomes, Breakers())
        consumer = ShareConsumer(
            {
                **config,
                **self.consumer_kafka,
                # redrive's guarantees rest on these: not to be overridden.
                "group.id": self.group,
                "share.acknowledgement.mode": "explicit",
            }
        )
        turns = Turns(
            consumer,
            pipeline,
            Settler(self.group, outcomes, terms.delivery_limit),
            publisher,
            self.share_metrics,
            terms,
            self.poll_timeout_s,
            self._fatal,
        )
        self._turns = turns
        try:
            consumer.subscribe(sorted(self._reads))
            log.info(
                "share consumer started",
                group=self.group,
                topics=sorted(self._reads),
                lock_ms=terms.lock_ms,
                delivery_limit=terms.delivery_limit,
            )
            self._loop(turns.turn, lambda: None)
        finally:
            try:
                publisher.flush()  # the last hand-offs before the last acknowledgements
                consumer.close()  # sends them, and leaves the group
            finally:
                turns.close()
                producer.flush(10)
                self.running.clear()
                log.info("share consumer stopped", group=self.group)

    def _assigned(self) -> int:
        return 0  # a share consumer is not told which partitions it reads

    def _poll_limit_ms(self) -> float:
        return max_poll_interval_ms({**self.kafka, **self.consumer_kafka})

    def _fatal(self, error: KafkaError) -> Exception:
        return fatal_group_error(error, self.group, None, "ShareApp(group=...)")
