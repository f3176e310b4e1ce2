"""The pipeline's per-record step: run the handler on one record, route its outcome.

Pure Python, no Spark: :class:`RecordHandler` is what the executors run for each
record (through :mod:`redrive.spark.batches`), kept apart so that its routing can be
read and tested on its own. :class:`Destinations` says where results, retries and dead
letters go; what a failure becomes is the failure router's decision
(:mod:`redrive.router`), the same as in the Python consumer.

A record's redrive headers are believed only where :class:`redrive.returns.ReturnCheck`
believes them (:meth:`RecordHandler.read`): they name the topic and partition the record
was read on and, with keys, carry a signature of ours. Anyone who may write a topic may
write those headers, and stream processors copy them from record to record. A record on
a source topic whose headers are not believed is a new record (attempt 1, its failure
named by where it was read); one on the group's retry topic (``per_group_topic``), where
only returns belong, is refused: a dead letter, never handed to the handler. Both are
counted (``doubted``) and logged with where they were read.

With keys, every ``redrive-id`` written to the requests topic is sealed first
(:meth:`redrive.signing.KeyRing.sealed_id`: deterministic, so a batch run again writes the
same, and no outsider can compute it), then the request is signed.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

import structlog

from redrive.clock import Clock, now_ms
from redrive.headers import (
    Header,
    HeaderError,
    RetryHeaders,
    encode,
    is_redrive_header,
    read_replay,
)
from redrive.policy import Policy
from redrive.returns import ReturnCheck
from redrive.router import (
    DeadLettered,
    FailedRecord,
    Outcome,
    RetryTarget,
    Router,
    SourceRecord,
    read_delivery,
)
from redrive.signing import KeyRing
from redrive.spark.output import OutputRecord
from redrive.topic_names import REQUESTS_TOPIC, dead_letter_topic, per_group_retry_topic

Handler: TypeAlias = Callable[[bytes | None, bytes | None, list[Header], int], bytes | None]
"""``handler(key, value, headers, attempt) -> output value``.

``headers`` are the record's own headers (the ``redrive-*`` ones removed), in order;
``attempt`` counts handler runs for this record: 1 on its first delivery, n + 1 after n
failures. Return the value to write to the output topic, or None to write nothing.
Raise to fail: the policy decides between a retry and a dead letter.
"""

DeadLetterTarget: TypeAlias = Literal["service", "topic"]


# The per-group retry topic of a topic: ``<group>.<topic>.retry``.
retry_topic = per_group_retry_topic

log = structlog.get_logger("redrive.spark")

_RETRY_SUFFIX: Final = ".retry"
LOG_EVERY_S: Final = 10.0
"""At most one log line per source partition in this time for records not believed:
a stream processor copying headers onto every record it writes would otherwise log
each (they are all counted, ``doubted``)."""


class _Throttle:
    """When to log for a partition again, and how many records went unlogged since."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, int], tuple[float, int]] = {}
        self._lock = threading.Lock()

    def due(self, topic: str, partition: int) -> int | None:
        """The records not logged since the last line if one is due now, else None."""
        now = time.monotonic()
        with self._lock:
            last, unlogged = self._last.get((topic, partition), (-LOG_EVERY_S, 0))
            if now - last < LOG_EVERY_S:
                self._last[topic, partition] = (last, unlogged + 1)
                return None
            self._last[topic, partition] = (now, 0)
            return unlogged


_throttle = _Throttle()


class RefusedReturn(Exception):
    """A record read on the group's retry topic that is not a return to the group: it
    is never handled, and its dead letter names this error."""


def has_redrive_headers(headers: list[Header]) -> bool:
    """Whether any header is one of redrive's (most records carry none)."""
    return any(is_redrive_header(name) for name, _ in headers)


@dataclass(frozen=True, slots=True)
class Reading:
    """What a record's headers say, as far as they are believed (:meth:`RecordHandler.read`)."""

    delivery: RetryHeaders | None
    """The redrive headers of a believed return; None for a new record."""
    user_headers: list[Header]
    """The record's own headers, the ``redrive-*`` ones removed."""
    attempt: int
    """The attempt about to run: 1 for a new record, n + 1 after n failures."""
    doubt: str | None = None
    """Why its redrive headers were not believed (None: believed, or there were none to
    believe: a first delivery, another group's retry)."""
    refused: bool = False
    """Read on the group's retry topic and not a return: not to be handled."""


@dataclass(frozen=True)
class Destinations:
    """Where the outcomes of the handler go. Validated when built.

    ``dead_letters="service"`` sends dead letters to ``requests_topic`` with
    ``redrive-send-to: dlq`` so that they land in the retry service's dead-letter
    store; ``"topic"`` sends them to ``dlq_topic`` (default: ``<original topic>.dlq``)
    with the same headers.
    """

    output_topic: str
    group: str
    requests_topic: str = REQUESTS_TOPIC
    per_group_topic: bool = False
    dead_letters: DeadLetterTarget = "service"
    dlq_topic: str | None = None

    def __post_init__(self) -> None:
        # RetryHeaders checks topic names and the group the way the contract does.
        for name in (self.output_topic, self.requests_topic, self.dlq_topic):
            if name is not None:
                _valid_headers(name, group=self.group)
        if self.per_group_topic:  # the group becomes part of a topic name
            _valid_headers(retry_topic(self.group, "t"), group=self.group)
        if self.dead_letters not in ("service", "topic"):
            raise ValueError(
                f"dead_letters must be 'service' or 'topic', got {self.dead_letters!r}"
            )

    def served_by(self, topic: str) -> str | None:
        """The source topic whose per-group retry topic ``topic`` is, when the pipeline
        has one (``per_group_topic``); None for a source topic."""
        prefix = f"{self.group}."
        if not self.per_group_topic or not topic.startswith(prefix):
            return None
        served = topic[len(prefix) :].removesuffix(_RETRY_SUFFIX)
        if not served or len(served) == len(topic) - len(prefix):
            return None
        return served

    def retry_destination(self, original_topic: str) -> str:
        """Where a retry of a record first read from ``original_topic`` is delivered."""
        if self.per_group_topic:
            return retry_topic(self.group, original_topic)
        return original_topic

    def dead_letter_topic(self, original_topic: str) -> str:
        if self.dead_letters == "service":
            return self.requests_topic
        return self.dlq_topic or dead_letter_topic(original_topic)


def _valid_headers(topic: str, *, group: str) -> None:
    try:
        RetryHeaders(destination=topic, retry_at=0, group=group)
    except HeaderError as exc:
        raise ValueError(f"invalid pipeline setting: {exc}") from None


@dataclass(frozen=True)
class RecordHandler:
    """Runs the handler on one record and routes the outcome (pure Python, no Spark).

    This is what the executors run for each record; it is separate from Spark so that
    its routing can be read and tested on its own. ``clock`` returns epoch ms.
    ``signing``: the keys what goes to the requests topic is signed with (retry
    requests, and dead letters for the service; their ``redrive-id`` sealed first), and
    a return's signature is checked with (:class:`redrive.returns.ReturnCheck`); None:
    unsigned, and a return is believed when it names the topic and partition it is
    read on.
    """

    handler: Handler
    policy: Policy
    destinations: Destinations
    clock: Clock = field(default=now_ms, compare=False)
    signing: KeyRing | None = field(default=None, compare=False)
    returns: ReturnCheck = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "returns", ReturnCheck(self.signing))

    def __call__(self, record: SourceRecord) -> OutputRecord | None:
        at = (record.topic, record.partition, record.offset)
        reading = self.read(record.headers, record.key, record.value, at)
        if reading.refused:
            return self.refused(record, reading)
        delivery, user_headers, attempt = reading.delivery, reading.user_headers, reading.attempt
        try:
            result = as_output_value(self.handler(record.key, record.value, user_headers, attempt))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:  # noqa: BLE001 - every failure of one record is routed
            return self.failed(record, delivery, user_headers, attempt, error)
        if result is None:
            return None
        return OutputRecord(self.destinations.output_topic, record.key, result, user_headers)

    def read(
        self,
        headers: list[Header],
        key: bytes | None,
        value: bytes | None,
        at: tuple[str, int, int],
    ) -> Reading:
        """What the headers of a record of ``key`` and ``value`` read ``at`` (topic,
        partition, offset) say: its retry headers if they are believed (None on a first
        delivery, for another group's retry, or for headers not believed), the user's
        headers, the attempt about to run; and whether it is refused (read on the
        group's retry topic, where every record must be a believed return)."""
        topic, partition, _ = at
        served = self.destinations.served_by(topic)
        # Most records carry no redrive header: skip the contract parsing for them.
        if not has_redrive_headers(headers):
            if served is None:
                return Reading(None, list(headers), 1)
            return self._refused(at, list(headers), "it carries no redrive headers")
        group = self.destinations.group
        delivery = read_delivery(headers, group)
        user_headers = [(n, v) for n, v in headers if not is_redrive_header(n)]
        if delivery is not None:
            doubt = self.returns.doubt(
                headers, key, value, delivery, (topic, partition), destination=topic
            )
            if doubt is None:
                return Reading(delivery, user_headers, delivery.attempt + 1)
        elif served is None:  # a first delivery, or another group's retry: new to this one
            return Reading(None, user_headers, 1)
        else:
            doubt = f"its redrive headers are not a return to group {group!r}"
        if served is not None:
            return self._refused(at, user_headers, doubt)
        _log_doubt("redrive headers not believed: handled as a new record", at, doubt)
        return Reading(None, user_headers, 1, doubt)

    def _refused(self, at: tuple[str, int, int], user_headers: list[Header], why: str) -> Reading:
        _log_doubt("record on the group's retry topic refused: a dead letter, not handled", at, why)
        return Reading(None, user_headers, 1, why, refused=True)

    def refused(self, record: SourceRecord, reading: Reading) -> OutputRecord:
        """The dead letter of a record :meth:`read` refused: named by where it was read,
        its home the topic whose retry topic it was read on (where a replay goes)."""
        failure = self._failure(record, None, reading.user_headers, 1)
        home = self.destinations.served_by(record.topic) or record.topic
        problem = (
            f"read on {record.topic!r}, the group's retry topic, without a return's "
            f"redrive headers: {reading.doubt}"
        )
        outcome = Router(self.policy, self.destinations.group, self.clock).reject(
            failure,
            RefusedReturn(problem),
            problem,
            dead_letters=self.destinations.dead_letter_topic(home),
            home=home,
        )
        return self._written(outcome, record, reading.user_headers)

    def failed(
        self,
        record: SourceRecord,
        delivery: RetryHeaders | None,
        user_headers: list[Header],
        attempt: int,
        error: BaseException,
    ) -> OutputRecord:
        """The retry request or dead letter for a record whose handler raised ``error``,
        as the failure router (:mod:`redrive.router`) decides it."""
        failure = self._failure(record, delivery, user_headers, attempt)
        home = record.topic
        if delivery is not None and delivery.original_topic:
            home = delivery.original_topic
        destinations = self.destinations
        destination = destinations.retry_destination(home)
        outcome = Router(self.policy, destinations.group, self.clock).route(
            failure,
            error,
            retry_to=RetryTarget.through(destinations.requests_topic, destination, failure),
            dead_letters=destinations.dead_letter_topic(home),
            home=home,
        )
        return self._written(outcome, record, user_headers)

    @staticmethod
    def _failure(
        record: SourceRecord,
        delivery: RetryHeaders | None,
        user_headers: list[Header],
        attempt: int,
    ) -> FailedRecord:
        return FailedRecord(
            record.topic,
            record.partition,
            record.offset,
            record.timestamp_ms,
            record.key,
            record.value,
            user_headers,
            delivery,
            attempt,
            read_replay(record.headers),
        )

    def _written(
        self, outcome: Outcome, record: SourceRecord, user_headers: list[Header]
    ) -> OutputRecord:
        """The row of a retry request or dead letter: to the requests topic with its id
        sealed and signed when there are keys."""
        if isinstance(outcome, DeadLettered):
            topic, headers, partition = outcome.topic, outcome.headers, None
        else:
            # Never None here: retry_to was given, so the retry has its request.
            assert outcome.request is not None
            assert outcome.target is not None
            topic, headers, partition = (
                outcome.target.topic,
                outcome.request,
                outcome.target.partition,
            )
        signing = self.signing
        if signing is None or topic != self.destinations.requests_topic:
            return OutputRecord(
                topic, record.key, record.value, encode(headers, user_headers), partition
            )
        if headers.id is not None:
            headers = dataclasses.replace(headers, id=signing.sealed_id(headers.id))
        written = signing.signed(encode(headers, user_headers), record.key, record.value)
        return OutputRecord(topic, record.key, record.value, written, partition)


def _log_doubt(event: str, at: tuple[str, int, int], why: str) -> None:
    topic, partition, offset = at
    unlogged = _throttle.due(topic, partition)
    if unlogged is not None:
        log.warning(
            event, topic=topic, partition=partition, offset=offset, why=why, unlogged=unlogged
        )


def as_output_value(result: object) -> bytes | None:
    """What the handler returned, as the output value; a TypeError if it is not bytes."""
    if result is None or isinstance(result, bytes):
        return result
    if isinstance(result, bytearray | memoryview):
        return bytes(result)
    raise TypeError(f"the handler must return bytes or None, got {type(result).__name__}")
