"""The pipeline's per-record step: run the handler on one record, route its outcome.

Pure Python, no Spark: :class:`RecordHandler` is what the executors run for each
record (through :mod:`redrive.spark.batches`), kept apart so that its routing can be
read and tested on its own. :class:`Destinations` says where results, retries and dead
letters go; what a failure becomes is the failure router's decision
(:mod:`redrive.router`), the same as in the Python consumer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

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
from redrive.router import (
    DeadLettered,
    FailedRecord,
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
    requests, and dead letters for the service); None: unsigned.
    """

    handler: Handler
    policy: Policy
    destinations: Destinations
    clock: Clock = field(default=now_ms, compare=False)
    signing: KeyRing | None = field(default=None, compare=False)

    def __call__(self, record: SourceRecord) -> OutputRecord | None:
        delivery, user_headers, attempt = self.delivery(record.headers)
        try:
            result = as_output_value(self.handler(record.key, record.value, user_headers, attempt))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:  # noqa: BLE001 - every failure of one record is routed
            return self.failed(record, delivery, user_headers, attempt, error)
        if result is None:
            return None
        return OutputRecord(self.destinations.output_topic, record.key, result, user_headers)

    def delivery(self, headers: list[Header]) -> tuple[RetryHeaders | None, list[Header], int]:
        """What a record's headers say: its retry headers (None on a first delivery, or
        another group's retry), the user's headers, and the attempt about to run."""
        # Most records carry no redrive header: skip the contract parsing for them.
        if not any(is_redrive_header(name) for name, _ in headers):
            return None, list(headers), 1
        delivery = read_delivery(headers, self.destinations.group)
        user_headers = [(n, v) for n, v in headers if not is_redrive_header(n)]
        return delivery, user_headers, delivery.attempt + 1 if delivery is not None else 1

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
        failure = FailedRecord(
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
        written = encode(headers, user_headers)
        if self.signing is not None and topic == destinations.requests_topic:
            written = self.signing.signed(written, record.key, record.value)
        return OutputRecord(topic, record.key, record.value, written, partition)


def as_output_value(result: object) -> bytes | None:
    """What the handler returned, as the output value; a TypeError if it is not bytes."""
    if result is None or isinstance(result, bytes):
        return result
    if isinstance(result, bytearray | memoryview):
        return bytes(result)
    raise TypeError(f"the handler must return bytes or None, got {type(result).__name__}")
