"""Registering handlers: which topics an App reads, for which route and how.

An App is a registry (what to handle, checked as it is registered) and a run of it
(:mod:`redrive.consumer.app`, :mod:`redrive.consumer.session`). Invariant: a topic
is read for one route only (a source, one of its tiers, its per-group topic); every
route is checked whole when registered (its handler, its options, key order against
the App's settings), so that nothing is refused once the App runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, Unpack

from redrive.consumer.batches import (
    DEFAULT_MAX_RECORDS,
    DEFAULT_MAX_WAIT_S,
    BatchSettings,
    batch_settings,
)
from redrive.consumer.handlers import check_handler
from redrive.consumer.key_order import check_key_order
from redrive.consumer.message import Message
from redrive.consumer.routes import (
    BatchHandlerOptions,
    HandlerOptions,
    Kind,
    Route,
    build_route,
)
from redrive.consumer.settings import AppSettings
from redrive.errors import ConfigError

Handler = TypeVar("Handler", bound=Callable[..., Any])

DEFAULT_POLICY = "1s, 10s, 1m"


class Routes:
    """The routes of a consumer, by the topic they handle and by every topic they read
    (see the module); how they are registered is the consumer's (:class:`Registry`
    for an App)."""

    def __init__(self, settings: AppSettings) -> None:
        self.settings = settings
        self.routes: dict[str, Route] = {}
        self._batched: dict[str, BatchSettings] = {}
        self._reads: dict[str, tuple[Route, Kind]] = {}

    @property
    def group(self) -> str:
        return self.settings.group

    def _check_ready(self) -> None:
        if not self.routes:
            raise ConfigError("handlers", "no handler registered", "use @app.handler(topic)")

    def _route(
        self,
        topic: str,
        fn: Callable[..., Any],
        options: HandlerOptions | BatchHandlerOptions,
        default_policy: str = DEFAULT_POLICY,
    ) -> Route:
        check_handler(topic, fn)
        if topic in self._reads:
            raise ConfigError(f"handler for {topic!r}", "registered twice")
        route = build_route(topic, fn, self.settings.group, options, default_policy)
        check_key_order(route, self.settings.transactional, self.settings.consumer_config)
        return route

    def _register(self, route: Route) -> None:
        for name, kind in route.topics().items():
            if name in self._reads:
                raise ConfigError(f"handler for {route.topic!r}", f"topic {name!r} is already read")
            self._reads[name] = (route, kind)
        self.routes[route.topic] = route


class Registry(Routes):
    """An App's registration: handlers and batch handlers with a strategy each."""

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
        if route.dead_letter_brake is not None:  # not in BatchHandlerOptions: untyped callers
            raise ConfigError(
                f"dead_letter_brake for batch handler {topic!r}",
                "batch handlers have no dead-letter brake yet",
                "use a single-record handler (@app.handler), or no brake",
            )
        settings = batch_settings(topic, fn, route.strategy, max_records, max_wait)
        self._register(route)
        self._batched[topic] = settings
