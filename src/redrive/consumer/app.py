"""`redrive.App`: register handlers with a policy and a strategy, then run the loop.

One App is one consumer group on one confluent-kafka Consumer. The loop reads a
batch, runs each record's handler, and decides what happens on failure with the
handler's policy; the strategy decides how the waiting happens:

- blocking: the record is sought back and its partition paused until the retry is
  due; other partitions flow, and the loop keeps polling (no sleep, no rebalance).
- pause: the same, but every assigned partition waits (a circuit breaker).
- topics: the record goes to the tier topic of its delay, `<topic>.retry.<delay>`;
  the app reads the tiers too and handles a tier record once it is due, pausing
  the tier partition until its head record is due.
- service: the record goes to the retry service's requests topic with the contract
  headers; the service brings it back when due.

Offsets are committed only past records dealt with: handled, or handed off to Kafka
and acknowledged. On a revoke the loop commits what it dealt with and forgets the
paused state of the partitions it loses.

No record stops the loop: one whose headers cannot be read, or on which redrive's own
work fails (as opposed to its handler), goes to the dead letters with its raw key
and value and the reason, and the loop goes on past it.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypedDict, TypeVar, Unpack

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka import Message as KafkaMessage
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry

from redrive.consumer.handlers import check_handler, refuse_awaitable
from redrive.consumer.message import Message
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.offsets import OffsetTracker, Partition
from redrive.consumer.pauses import PauseBook
from redrive.consumer.publisher import Publisher
from redrive.consumer.routes import DeadLetterTarget, Kind, Route, Strategy
from redrive.consumer.topics import create_derived_topics
from redrive.errors import ConfigError
from redrive.headers import (
    MAX_INT32,
    MAX_INT64,
    Header,
    RetryHeaders,
    describe_error,
    is_redrive_header,
    next_request,
    read_delivery_headers,
)
from redrive.kafka import consume_available, read_headers
from redrive.membership import fatal_group_error, static_membership
from redrive.policy import DeadLetter, DeadLetterReason, FatalError, Retry, policy
from redrive.sizes import producer_size_limit

log = structlog.get_logger("redrive.consumer")

Handler = TypeVar("Handler", bound=Callable[..., Any])
RetryHook = Callable[[Message, Retry, BaseException], None]
DeadLetterHook = Callable[[Message | None, DeadLetter, BaseException], None]

DEFAULT_POLICY = "1s, 10s, 1m"
INSTANCE_ID_SETTING = "App(instance_id=...)"
TIER_CLOCK_SLACK_MS = 60_000
"""How much later than its tier's delay a tier record may be due and still be waited
for: room for clocks of app instances that disagree. Anything later is forged or
corrupt, and is handled at once rather than holding its partition for ever."""


class HandlerOptions(TypedDict, total=False):
    """Options of :meth:`App.handler` and :meth:`App.add_handler`."""

    policy: Any
    """A schedule string, a list of delays, or a Policy (default ``"1s, 10s, 1m"``)."""
    strategy: Strategy
    retry_on: type[BaseException] | Iterable[type[BaseException]]
    fatal_on: type[BaseException] | Iterable[type[BaseException]]
    retryable: Callable[[BaseException], bool | None] | None
    max_attempts: int | None
    max_duration: str | float | None
    value_deserializer: Callable[[bytes], Any] | None
    dead_letters: DeadLetterTarget | None
    per_group_topic: bool


class DeserializationError(FatalError):
    """A record's value could not be deserialized: retrying cannot help."""


# Dead letters name it by its public name, the one users import and search for.
DeserializationError.__module__ = "redrive"


class UnreadableHeadersError(FatalError):
    """A record's headers cannot all be read (a header name that is not UTF-8, which
    any Kafka producer can write): it goes to the dead letters with those that can."""


class UnprocessableRecordError(FatalError):
    """redrive's own work on a record failed (not its handler's): rather than stop the
    consumer at that record, it goes to the dead letters with the cause."""


UnreadableHeadersError.__module__ = "redrive.consumer"
UnprocessableRecordError.__module__ = "redrive.consumer"


@dataclass(frozen=True, slots=True)
class _InPlace:
    """A record being retried in place (blocking, pause): its failures so far."""

    offset: int
    failures: int
    first_failure_ms: int


@dataclass(frozen=True, slots=True)
class _Wait:
    until_ms: int
    all_partitions: bool = False


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


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
        commit_interval_s: float = 1.0,
        poll_timeout_s: float = 0.1,
        on_retry: RetryHook | None = None,
        on_dead_letter: DeadLetterHook | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.bootstrap = bootstrap or os.environ.get("REDRIVE_BOOTSTRAP", "localhost:9092")
        self.group = group
        self.kafka = dict(kafka or {})
        self.consumer_kafka = {**static_membership(instance_id), **(consumer_kafka or {})}
        self.requests_topic = requests_topic or os.environ.get(
            "REDRIVE_REQUESTS_TOPIC", "redrive.requests"
        )
        self.batch_size = batch_size
        self.commit_interval_s = commit_interval_s
        self.poll_timeout_s = poll_timeout_s
        self.on_retry = on_retry
        self.on_dead_letter = on_dead_letter
        self.metrics = ConsumerMetrics(registry)
        self.routes: dict[str, Route] = {}
        self._reads: dict[str, tuple[Route, Kind]] = {}
        self._in_place: dict[Partition, _InPlace] = {}
        self._batch_handled: dict[str, int] = {}
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
        (default ``"1s, 10s, 1m"``); ``strategy`` is ``blocking``, ``pause``, ``topics`` or
        ``service`` (the default). ``dead_letters`` is ``"service"`` (the retry service's
        store; the default with strategy ``service``) or ``"topic"`` (``<topic>.dlq``; the
        default otherwise). See :class:`HandlerOptions` for the rest.
        """

        def register(fn: Handler) -> Handler:
            self.add_handler(topic, fn, **options)
            return fn

        return register

    def add_handler(
        self, topic: str, fn: Callable[[Message], Any], **options: Unpack[HandlerOptions]
    ) -> None:
        """The same as :meth:`handler`, without the decorator."""
        unknown = sorted(set(options) - set(HandlerOptions.__annotations__))
        if unknown:
            raise TypeError(f"unknown handler option(s) {unknown}; see HandlerOptions")
        check_handler(topic, fn)
        strategy = options.get("strategy", "service")
        per_group_topic = options.get("per_group_topic", False)
        if topic in self._reads:
            raise ConfigError(f"handler for {topic!r}", "registered twice")
        from redrive.policy import PolicyError

        try:
            chosen = _policy(
                options.get("policy", DEFAULT_POLICY),
                retry_on=options.get("retry_on", ()),
                fatal_on=options.get("fatal_on", ()),
                retryable=options.get("retryable"),
                max_attempts=options.get("max_attempts"),
                max_duration=options.get("max_duration"),
            )
        except PolicyError as exc:
            raise ConfigError(f"policy for {topic!r}", str(exc)) from None
        if per_group_topic and strategy != "service":
            raise ConfigError(
                f"per_group_topic for {topic!r}",
                "only the service strategy delivers to a per-group topic",
            )
        target = options.get("dead_letters") or ("service" if strategy == "service" else "topic")
        route = Route(
            topic,
            fn,
            chosen,
            strategy,
            self.group,
            options.get("value_deserializer"),
            target,
            per_group_topic,
        )
        for name, kind in route.topics().items():
            if name in self._reads:
                raise ConfigError(f"handler for {topic!r}", f"topic {name!r} is already read")
            self._reads[name] = (route, kind)
        self.routes[topic] = route

    # ------------------------------------------------------------------ running

    def stop(self) -> None:
        """Ask the loop to finish its current record, commit and return (thread-safe)."""
        self._stop.set()

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Consume until :meth:`stop`, SIGTERM or SIGINT; commits what was dealt with."""
        if not self.routes:
            raise ConfigError("handlers", "no handler registered", "use @app.handler(topic)")
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
        config = {"bootstrap.servers": self.bootstrap, **self.kafka}
        admin = AdminClient(config)
        create_derived_topics(admin, list(self.routes.values()))
        consumer = Consumer(
            {
                # Defaults the user's `kafka` settings may override...
                "auto.offset.reset": "earliest",
                # A resumed partition joins the next fetch request only when the one in
                # flight returns; librdkafka's default long poll (500 ms) would make an
                # in-place retry up to that late (measured: 200 ms retries came after a
                # median of 307 ms, max 506; with 50 ms: 214 and 296).
                "fetch.wait.max.ms": 50,
                **config,
                **self.consumer_kafka,
                # ...and what redrive's guarantees rest on, which they may not.
                "group.id": self.group,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "on_commit": self._on_commit,
            }
        )
        # As large as what it reads, so that a record a topic accepted can be handed
        # to its retry or dead-letter topic (see redrive.sizes); `kafka` may say more.
        size_limit = producer_size_limit(admin, self._reads)
        producer = Producer({**size_limit, **config, "enable.idempotence": True, "linger.ms": 5})
        self._consumer = consumer
        self._producer = producer
        self._publisher = Publisher(producer, self._stop)
        self._offsets = OffsetTracker()
        self._pauses = PauseBook(consumer)
        consumer.subscribe(
            list(self._reads),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        log.info("consumer started", group=self.group, topics=sorted(self._reads))
        self.running.set()
        last_commit = time.monotonic()
        try:
            while not self._stop.is_set():
                self._poll_once()
                if time.monotonic() - last_commit >= self.commit_interval_s:
                    self._commit(asynchronous=True)
                    last_commit = time.monotonic()
        finally:
            self._shutdown()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        log.info("signal received; stopping", signal=signal.Signals(signum).name)
        self._stop.set()

    def _poll_once(self) -> None:
        assert self._consumer is not None
        pauses = self._pauses
        now = _now_ms()
        pauses.resume_due(now)
        timeout = self.poll_timeout_s
        next_due = pauses.next_due_ms()
        if next_due is not None:
            timeout = min(timeout, max(next_due - now, 0) / 1000)
        records = consume_available(self._consumer, self.batch_size, timeout)
        if not records:
            return
        # The success path is the hot path: per record only the handler call and a few
        # dict operations; positions and counts are recorded once per batch.
        rewound: set[Partition] = set()
        positions: dict[Partition, int] = {}
        self._batch_handled.clear()
        waiting = pauses.active  # refreshed when a record makes its partition wait
        started = time.perf_counter()
        for index, record in enumerate(records):
            error = record.error()
            if error is not None:
                # librdkafka reports a fatal consumer error as an error event of code
                # _FATAL (its fatal() flag unset): the consumer is dead, say why.
                if error.code() == KafkaError._FATAL:
                    instance_id = self.consumer_kafka.get("group.instance.id")
                    raise fatal_group_error(error, self.group, instance_id, INSTANCE_ID_SETTING)
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error", error=error.str())
                continue
            topic, partition, offset = record.topic(), record.partition(), record.offset()
            if topic is None or partition is None or offset is None:
                continue  # only error events lack coordinates, and those were handled above
            tp = (topic, partition)
            if rewound and tp in rewound:
                continue
            if waiting and pauses.waiting(tp):
                # Fetched before its partition was paused, or assigned during a breaker.
                pauses.wait(tp, offset, pauses.until(tp))
                rewound.add(tp)
                continue
            try:
                outcome = self._process(record, topic, partition, offset)
            except Exception as exc:  # noqa: BLE001 - no record may stop the consumer
                self._unprocessable(record, topic, partition, offset, exc)
                outcome = None
            if outcome is None:
                positions[tp] = offset
                continue
            pauses.wait(tp, offset, outcome.until_ms)
            waiting = True
            rewound.add(tp)
            if outcome.all_partitions:
                for later in records[index + 1 :]:
                    lt, lp, lo = later.topic(), later.partition(), later.offset()
                    if (
                        later.error() is None
                        and lt is not None
                        and lp is not None
                        and ((lt, lp) not in rewound)
                        and lo is not None
                    ):
                        self._consumer.seek(TopicPartition(lt, lp, lo))
                        rewound.add((lt, lp))
                pauses.pause_all(outcome.until_ms)
                break
        for tp, offset in positions.items():
            self._offsets.mark(tp, offset)
        for topic, count in self._batch_handled.items():
            self.metrics.records.labels(topic, "handled").inc(count)
        # Timed per batch, not per record: two clock reads per record cost more than
        # redrive's own work on the success path.
        self.metrics.handler_seconds.inc(time.perf_counter() - started)
        self.metrics.waiting_partitions.set(pauses.count())

    # ------------------------------------------------------------------ one record

    def _process(
        self, record: KafkaMessage, topic: str, partition: int, offset: int
    ) -> _Wait | None:
        """Deal with one record; None when it is dealt with, else how long to wait."""
        route, kind = self._reads[topic]
        headers, unreadable = read_headers(record)
        delivery = None
        user_headers = headers
        if headers and any(is_redrive_header(name) for name, _ in headers):
            delivery = self._delivery(headers)
            user_headers = [(k, v) for k, v in headers if not is_redrive_header(k)]
        if unreadable is not None:
            self._unreadable(route, record, user_headers, delivery, unreadable)
            return None
        if kind == "tier" and delivery is not None:
            wait = self._tier_wait(route, topic, partition, offset, delivery)
            if wait is not None:
                return wait
        state = self._in_place.get((topic, partition)) if self._in_place else None
        if state is not None and state.offset != offset:
            state = None
        failures = state.failures if state else (delivery.attempt if delivery else 0)
        raw_value = record.value()
        deserialize = route.value_deserializer
        try:
            # A tombstone (no value) reaches the handler as None, not through the deserializer.
            value = (
                raw_value if deserialize is None or raw_value is None else deserialize(raw_value)
            )
        except Exception as exc:  # noqa: BLE001 - any deserializer failure is the record's
            shown = _safe_repr(exc, limit=None)
            error: BaseException = DeserializationError(f"cannot deserialize: {shown}")
            error.__cause__ = exc
            dead = DeadLetter(
                DeadLetterReason.FATAL_ERROR,
                f"fatal error: value cannot be deserialized ({shown})",
                failures + 1,
            )
            self._dead_letter(route, record, None, user_headers, delivery, error, dead)
            return None
        stamp_type, stamp = record.timestamp()  # _timestamp(record), without a call
        message = Message(
            topic,
            partition,
            offset,
            record.key(),
            value,
            raw_value,
            user_headers,
            stamp if stamp_type and stamp >= 0 else None,
            failures + 1,
            delivery,
        )
        try:
            result = route.handler(message)
        except Exception as exc:  # noqa: BLE001 - the handler's failure is what we handle
            return self._failed(route, record, message, delivery, state, exc)
        if result is not None and inspect.isawaitable(result):
            # An async function behind a plain one: its body never ran.
            return self._failed(route, record, message, delivery, state, refuse_awaitable(result))
        handled = self._batch_handled
        handled[route.topic] = handled.get(route.topic, 0) + 1
        if state is not None:
            del self._in_place[(topic, partition)]
        return None

    def _delivery(self, headers: list[Header]) -> RetryHeaders | None:
        """What the redrive headers of a record say of its past, if they concern us.

        They may be forged or garbled (any producer can write them): the reader drops
        what is invalid, and an attempt count at the very top of its range is lowered
        by one so that counting one more failure stays within it."""
        delivery = read_delivery_headers(headers)
        if delivery is None or delivery.group not in (None, self.group):
            return None  # another group's retry of a shared topic: new to us
        if delivery.attempt >= MAX_INT32:
            delivery = dataclasses.replace(delivery, attempt=MAX_INT32 - 1)
        return delivery

    def _tier_wait(
        self, route: Route, topic: str, partition: int, offset: int, delivery: RetryHeaders
    ) -> _Wait | None:
        """How long a tier record waits: until due, unless it claims to be due later
        than its tier's delay allows (a forged or corrupt retry-at), which would hold
        the tier partition for ever; such a record is handled now."""
        now = _now_ms()
        if delivery.retry_at <= now:
            return None
        if delivery.retry_at - now <= route.tier_delay_ms(topic) + TIER_CLOCK_SLACK_MS:
            return _Wait(delivery.retry_at)
        log.warning(
            "tier record due later than its tier's delay allows; handled now",
            topic=topic,
            partition=partition,
            offset=offset,
            retry_at=delivery.retry_at,
        )
        return None

    def _unreadable(
        self,
        route: Route,
        record: KafkaMessage,
        user_headers: list[Header],
        delivery: RetryHeaders | None,
        problem: str,
    ) -> None:
        """A record with headers that cannot be read: a dead letter with those that can
        (its handler would see a record that is not what was written)."""
        error = UnreadableHeadersError(problem)
        attempt = delivery.attempt + 1 if delivery else 1
        dead = DeadLetter(DeadLetterReason.FATAL_ERROR, f"fatal error: {problem}", attempt)
        self._dead_letter(route, record, None, user_headers, delivery, error, dead)

    def _unprocessable(
        self, record: KafkaMessage, topic: str, partition: int, offset: int, cause: Exception
    ) -> None:
        """redrive failed on a record (a bug, or input no check foresaw): a dead letter
        built from the record alone, so that the consumer goes on. Should even that
        fail (the producer refuses it), the error stops the loop, uncommitted."""
        log.exception(
            "cannot process record; dead-lettering it",
            topic=topic,
            partition=partition,
            offset=offset,
        )
        self._in_place.pop((topic, partition), None)
        route, _ = self._reads[topic]
        readable = read_headers(record)[0]
        headers = [(k, v) for k, v in readable if not is_redrive_header(k)]
        shown = _safe_repr(cause)
        error = UnprocessableRecordError(f"redrive could not process this record: {shown}")
        error.__cause__ = cause
        text = f"fatal error: redrive could not process this record ({shown})"
        dead = DeadLetter(DeadLetterReason.FATAL_ERROR, text, 1)
        self._dead_letter(route, record, None, headers, None, error, dead)

    def _failed(
        self,
        route: Route,
        record: KafkaMessage,
        message: Message,
        delivery: RetryHeaders | None,
        state: _InPlace | None,
        error: BaseException,
    ) -> _Wait | None:
        now = _now_ms()
        failures = message.attempt
        original_ts = delivery.original_timestamp if delivery else None
        decision = route.policy.decide(
            failures,
            error,
            now_ms=now,
            first_failure_ms=state.first_failure_ms if state else None,
            record_timestamp_ms=original_ts if original_ts is not None else message.timestamp_ms,
            deadline_ms=delivery.deadline if delivery else None,
        )
        tp = (message.topic, message.partition)
        log.info(
            "handler failed",
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            attempt=failures,
            error=_safe_repr(error),
            decision=str(decision)
            if isinstance(decision, DeadLetter)
            else f"retry in {decision.delay_ms} ms",
        )
        if isinstance(decision, DeadLetter):
            self._in_place.pop(tp, None)
            self._dead_letter(route, record, message, message.headers, delivery, error, decision)
            return None
        if route.strategy in ("blocking", "pause"):
            self._retried(route, message, decision, error)
            first = state.first_failure_ms if state else now
            self._in_place[tp] = _InPlace(message.offset, failures, first)
            return _Wait(decision.at_ms, all_partitions=route.strategy == "pause")
        request = self._request(route, record, message, delivery, error, decision)
        # A tier has its source's partition count: the record keeps its partition there.
        destination = route.tier_for(failures) if route.strategy == "topics" else None
        partition = message.partition if destination is not None else None
        self._publisher.send(
            destination or self.requests_topic,
            key=record.key(),
            value=message.raw_value,
            user_headers=message.headers,
            redrive=request,
            partition=partition,
        )
        self._retried(route, message, decision, error)
        return None

    def _retried(
        self, route: Route, message: Message, decision: Retry, error: BaseException
    ) -> None:
        """Counted once the retry is under way (a hand-off that raised is not one)."""
        self.metrics.records.labels(route.topic, "retried").inc()
        self._hook(self.on_retry, message, decision, error)

    def _request(
        self,
        route: Route,
        record: KafkaMessage,
        message: Message,
        delivery: RetryHeaders | None,
        error: BaseException,
        decision: Retry,
    ) -> RetryHeaders:
        """The contract headers of this record's next retry."""
        if route.strategy == "topics":
            destination, partition = route.topic, None
        else:
            destination = route.redelivery_topic
            # Back to the partition it came from, so a key's records stay together.
            same = destination == message.topic
            partition = message.partition if same else None
        return next_request(
            delivery,
            destination=destination,
            retry_at=decision.at_ms,
            error=error,
            record_topic=message.topic,
            record_partition=message.partition,
            record_offset=message.offset,
            record_timestamp=message.timestamp_ms,
            deadline=_header_time(decision.deadline_ms),
            group=self.group,
            partition=partition,
        )

    def _dead_letter(
        self,
        route: Route,
        record: KafkaMessage,
        message: Message | None,
        user_headers: list[Header],
        delivery: RetryHeaders | None,
        error: BaseException,
        dead: DeadLetter,
    ) -> None:
        topic, partition, offset = record.topic(), record.partition(), record.offset()
        info = describe_error(error)
        headers = next_request(
            delivery,
            destination=route.topic,
            retry_at=_now_ms(),
            error=info,
            record_topic=topic,
            record_partition=partition,
            record_offset=offset,
            record_timestamp=_timestamp(record),
            group=self.group,
            send_to="dlq",
            deadline=delivery.deadline if delivery else None,
            reason=dead.text,
            attempt=dead.attempt,
        )
        target = self.requests_topic if route.dead_letters == "service" else route.dlq_topic
        self._publisher.send(
            target,
            key=record.key(),
            value=record.value(),
            user_headers=user_headers,
            redrive=headers,
        )
        self.metrics.records.labels(route.topic, "dead_lettered").inc()
        log.warning(
            "dead-lettered",
            topic=topic,
            partition=partition,
            offset=offset,
            to=target,
            reason=dead.text,
        )
        self._hook(self.on_dead_letter, message, dead, error)

    def _hook(self, hook: Callable[..., None] | None, *args: Any) -> None:
        if hook is None:
            return
        try:
            hook(*args)
        except Exception:
            log.exception("hook failed", hook=getattr(hook, "__name__", repr(hook)))

    # ------------------------------------------------------------------ commits, rebalances

    def _commit(self, *, asynchronous: bool, partitions: set[Partition] | None = None) -> None:
        assert self._consumer is not None
        self._publisher.flush()  # hand-offs acknowledged before the offsets move past them
        offsets = self._offsets.to_commit(partitions)
        if not offsets:
            return
        try:
            if asynchronous:
                self._consumer.commit(offsets=offsets, asynchronous=True)
            else:
                self._offsets.committed(self._consumer.commit(offsets=offsets, asynchronous=False))
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:
                log.warning("commit failed; records may be handled again", error=str(exc))

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if err is None:
            self._offsets.committed([tp for tp in partitions if tp.error is None])
        elif err.code() != KafkaError._NO_OFFSET:
            log.warning("commit failed; records may be handled again", error=err.str())

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info(
            "partitions assigned", partitions=[f"{p.topic}[{p.partition}]" for p in partitions]
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        lost = {(p.topic, p.partition) for p in partitions}
        try:
            self._commit(asynchronous=False, partitions=lost)
        finally:
            self._forget(lost)
        log.info("partitions revoked", partitions=sorted(f"{t}[{p}]" for t, p in lost))

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        lost = {(p.topic, p.partition) for p in partitions}
        self._forget(lost)
        log.warning("partitions lost", partitions=sorted(f"{t}[{p}]" for t, p in lost))

    def _forget(self, partitions: set[Partition]) -> None:
        """Partitions leave this instance. Positions go (the next owner commits its own);
        a partition waiting for a retry is resumed in the client but its wait and attempt
        count are kept, in case a rebalance gives it back: then its record waits until
        due again, with its attempts counted, instead of staying paused forever."""
        self._offsets.forget(partitions)
        self._pauses.release(partitions)
        parked = self._pauses.parked()
        for partition in partitions:
            if partition not in parked:
                self._in_place.pop(partition, None)

    def _shutdown(self) -> None:
        consumer = self._consumer
        try:
            self._commit(asynchronous=False)
        except Exception:
            log.exception("could not commit on shutdown; records will be handled again")
        finally:
            if consumer is not None:
                consumer.close()
            self._producer.close()
            self.running.clear()
            log.info("consumer stopped", group=self.group)


def _policy(spec: Any, **options: Any) -> Any:
    options = {k: v for k, v in options.items() if v not in (None, ())}
    return policy(spec, **options)


def _safe_repr(value: object, limit: int | None = 200) -> str:
    """repr() for logs and reasons, which a broken __repr__ must not turn into a crash."""
    try:
        return repr(value)[:limit]
    except Exception:  # noqa: BLE001 - any failure of user code in __repr__
        return f"<unprintable {type(value).__name__}>"


def _header_time(ms: int | None) -> int | None:
    """A time as a header can hold it. A policy deadline counted from a far-future
    (forged) timestamp can pass the largest; a later deadline would mean nothing more."""
    return None if ms is None else min(ms, MAX_INT64)


def _timestamp(record: KafkaMessage) -> int | None:
    """The record's time; None when it has none (type 0) or it is negative: the only
    negative time a producer may mean is -1, none, and a later header cannot hold it."""
    kind, value = record.timestamp()
    return value if kind != 0 and value >= 0 else None
