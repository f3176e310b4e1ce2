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

from collections.abc import Callable, Mapping
from typing import Any, TypeVar, Unpack, cast

import structlog
from confluent_kafka import KafkaError, ShareConsumer
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry

from redrive.client_logs import with_client_logs
from redrive.consumer.async_records import DEFAULT_MAX_IN_FLIGHT
from redrive.consumer.clients import make_producer
from redrive.consumer.loop_health import max_poll_interval_ms
from redrive.consumer.message import Message
from redrive.consumer.outcomes import Outcomes
from redrive.consumer.pipeline import Pipeline
from redrive.consumer.publisher import publisher_for
from redrive.consumer.refusals import DEFAULT_RULE, ReturnRule, return_check
from redrive.consumer.registry import Routes
from redrive.consumer.repeats import DEFAULT_REPEAT_WINDOW, RecentIds
from redrive.consumer.routes import HandlerOptions, RouteOptions
from redrive.consumer.running import Running
from redrive.consumer.settings import AppSettings, DeadLetterHook, Hooks, Polling, RetryHook
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
from redrive.signing import KeyRing

log = structlog.get_logger("redrive.share")

Handler = TypeVar("Handler", bound=Callable[..., Any])

DEFAULT_POLICY = "0s, 1s, 10s"


class ShareHandlerOptions(RouteOptions, total=False):
    """Options of :meth:`ShareApp.handler`: the policy's, and where retries come back."""

    per_group_topic: bool
    """Retries due later come back on ``<group>.<topic>.retry`` (read by the group too)
    rather than on ``<topic>``, where every other group reading it would see them."""


class ShareApp(Routes, Running):
    """A share-group consumer whose failed records come back when due (see the module).

    ``kafka`` adds librdkafka settings to the share consumer and the producer alike;
    ``consumer_kafka`` to the share consumer only. ``requests_topic``, ``partitioner``,
    ``repeat_window``, ``signing``, ``returns``, ``on_retry``, ``on_dead_letter``,
    ``metrics_port`` and ``metrics_host`` are :class:`redrive.App`'s (``returns`` for
    the per-group topic, its one retry path). Where a share group starts reading a
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
        signing: KeyRing | None = None,
        returns: ReturnRule = DEFAULT_RULE,
        registry: CollectorRegistry | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
    ) -> None:
        settings = AppSettings.of(
            bootstrap,
            group,
            kafka=kafka,
            consumer_kafka=consumer_kafka,
            instance_id=None,  # a share group has no static membership
            requests_topic=requests_topic,
            partitioner=partitioner,
            transactional=False,  # share acknowledgements cannot join a transaction
            repeat_window=repeat_window,
            # Of the loop's settings a share consumer uses the poll timeout only: the
            # broker decides how many records a poll acquires, acknowledgements
            # replace commits, and async records are bounded by the poll.
            polling=Polling(500, poll_timeout_s, 1.0, DEFAULT_MAX_IN_FLIGHT),
            hooks=Hooks(on_retry, on_dead_letter),
            signing=signing,
            returns=returns,
            returns_setting="ShareApp(returns=...)",
        )
        Routes.__init__(self, settings)
        self.share_metrics = ShareMetrics(registry)
        Running.__init__(self, self.share_metrics, metrics_port, metrics_host)

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
        if "dead_letter_brake" in options:  # an App's option, from untyped callers
            raise ConfigError(
                f"dead_letter_brake for {topic!r}",
                "a ShareApp has no dead-letter brake yet",
                "leave it out, or use an App",
            )
        given = {k: v for k, v in options.items() if k != "per_group_topic"}
        route_options = cast(HandlerOptions, given)
        route_options["strategy"] = Service(per_group_topic=bool(options.get("per_group_topic")))
        self._register(self._route(topic, fn, route_options, DEFAULT_POLICY))

    # ------------------------------------------------------------------ running

    def _consume(self) -> None:
        config = with_client_logs(
            {"bootstrap.servers": self.settings.bootstrap, **self.settings.kafka}
        )
        admin = AdminClient(config)
        create_derived_topics(admin, list(self.routes.values()))
        terms = read_terms(admin, self.group)
        producer = make_producer(admin, config, self._reads, self.settings.partitioner)
        publisher = publisher_for(
            producer, self._stop, self.settings.signing, self.settings.requests_topic
        )
        outcomes = Outcomes(
            self.group,
            self.settings.requests_topic,
            publisher,
            self.metrics,
            self.settings.hooks,
            RecentIds(self.settings.repeat_window, self.settings.unsigned_returns),
            transactional=False,
            returns=self.settings.returns,
            signing=self.settings.signing is not None,
        )
        steps = build_steps(self.routes.values(), KeyOrders(None, None), Breakers())
        check = return_check(self.settings.signing, self.settings.returns)
        pipeline = Pipeline(self.group, self._reads, steps, outcomes, Breakers(), check=check)
        consumer = ShareConsumer(
            {
                **config,
                **self.settings.consumer_kafka,
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
            self.settings.polling.poll_timeout_s,
            self._fatal,
        )
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
        return max_poll_interval_ms(self.settings.consumer_config)

    def _fatal(self, error: KafkaError) -> Exception:
        return fatal_group_error(error, self.group, None, "ShareApp(group=...)")
