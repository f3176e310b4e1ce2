"""What the Spark scheduler checks each request against, on the executors.

The rules are built and checked on the driver, then shipped to the executors with
the query: the destination allowlist and delay limit of ``redrive serve``, and topic
metadata from one admin client per Python worker: partition counts, and the limits a
destination's broker enforces for good (:class:`DeliveryCheck`). The Kafka sink has no
per-record answer: a record the broker refuses fails the whole batch, and the same
batch would fail again after every restart. So what the broker would refuse for good
is found before writing, and becomes a dead letter instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import structlog

from redrive.client_logs import with_client_logs
from redrive.destinations import DestinationAllowlist, check_patterns
from redrive.errors import ConfigError
from redrive.headers import is_topic_name
from redrive.requests import IntakeRules
from redrive.signing import SignatureCheck
from redrive.sizes import (
    TopicLimits,
    single_record_batch_size,
    single_record_batch_size_at_most,
    topic_limits,
)
from redrive.spark.output import OutputRecord

log = structlog.get_logger("redrive.spark.scheduler")

LIMITS_TTL_S: Final = 30.0
"""How long a destination's limits are trusted before they are read again."""

METADATA_WAIT_S: Final = 120.0
"""How long a batch waits for the broker to answer topic metadata before failing."""


@dataclass(frozen=True)
class SchedulerRules:
    """What the scheduler checks requests against; shipped to the executors.

    Checked as ``redrive serve`` checks its settings of the same names
    (:meth:`checked`), and matched with the same allowlist, so that a pattern means
    exactly what it means to the service.
    """

    requests_topic: str
    dlq_topic: str
    allowed_destinations: tuple[str, ...]
    max_delay_ms: int
    admin_config: tuple[tuple[str, str], ...]
    """librdkafka settings of the client that looks up topic metadata."""
    compressed: bool = False
    """The sink compresses: a record's size is not known before it is sent."""
    repeat_window_ms: int = 7 * 86_400_000
    """How long an accepted request's identity is kept (:mod:`redrive.spark.repeats`)."""
    signatures: SignatureCheck | None = None
    """What is asked of a request's signature, as the service asks it (its settings
    ``require_signatures``, ``signing_keys``, ``signing_key_files``)."""

    @classmethod
    def checked(
        cls,
        *,
        requests_topic: str,
        dlq_topic: str,
        allowed_destinations: Sequence[str],
        max_delay_days: float,
        admin_config: Mapping[str, str],
        compressed: bool = False,
        repeat_window_days: float = 7.0,
        signatures: SignatureCheck | None = None,
    ) -> SchedulerRules:
        """The rules, or a ConfigError naming the first argument that is wrong."""
        for name, topic in (("requests_topic", requests_topic), ("dlq_topic", dlq_topic)):
            if not is_topic_name(topic):
                raise ConfigError(name, f"{topic!r} is not a legal Kafka topic name")
        try:
            check_patterns(allowed_destinations)
        except ValueError as exc:
            raise ConfigError("allowed_destinations", str(exc)) from None
        if not max_delay_days > 0:
            raise ConfigError("max_delay_days", f"must be greater than 0, got {max_delay_days}")
        if not repeat_window_days > 0:
            raise ConfigError(
                "repeat_window_days", f"must be greater than 0, got {repeat_window_days}"
            )
        return cls(
            requests_topic=requests_topic,
            dlq_topic=dlq_topic,
            allowed_destinations=tuple(allowed_destinations),
            max_delay_ms=int(max_delay_days * 86_400_000),
            admin_config=tuple(sorted(admin_config.items())),
            compressed=compressed,
            repeat_window_ms=int(repeat_window_days * 86_400_000),
            signatures=signatures,
        )

    def delivery_check(self) -> DeliveryCheck:
        """Whether a destination's broker would refuse a message for good (this
        worker's cache of topic limits)."""
        return _delivery_check(self.admin_config)

    def intake_rules(self) -> IntakeRules:
        """The rules for :func:`classify`: the service's allowlist and topic metadata
        from this worker's cache."""
        allowlist = DestinationAllowlist(self.allowed_destinations, self.requests_topic)
        return IntakeRules(
            destination_allowed=allowlist.allows,
            partitions_of=_partitions_lookup(self.admin_config),
            max_delay_ms=self.max_delay_ms,
            keeps_order=False,  # key order is the retry service's (ordering="key")
            signatures=self.signatures,
        )


_lookups: dict[tuple[tuple[str, str], ...], Callable[[str], int | None]] = {}
_lookups_lock = threading.Lock()


def _partitions_lookup(config: tuple[tuple[str, str], ...]) -> Callable[[str], int | None]:
    """Partition counts of topics, cached per Python worker (one admin client each).

    While the broker cannot answer, waits up to :data:`METADATA_WAIT_S`, then raises
    MetadataUnavailable, which fails the batch: the query stops, and a restart reads
    the same requests again. Nothing is dead-lettered for a broker outage.
    """
    with _lookups_lock:
        lookup = _lookups.get(config)
        if lookup is None:
            from confluent_kafka.admin import AdminClient

            from redrive.topic_admin import MetadataUnavailable, TopicMetadata

            metadata = TopicMetadata(AdminClient(with_client_logs(dict(config))))

            def partitions_of(topic: str) -> int | None:
                deadline = time.monotonic() + METADATA_WAIT_S
                delay = 0.2
                while True:
                    try:
                        return metadata.partitions_of(topic)
                    except MetadataUnavailable:
                        if time.monotonic() + delay > deadline:
                            raise
                        time.sleep(delay)
                        delay = min(delay * 2, 5.0)

            lookup = _lookups[config] = partitions_of
        return lookup


class DeliveryCheck:
    """Would the destination's broker refuse this message for good? Two refusals are
    known before sending: a record batch above the topic's ``max.message.bytes`` (the
    record alone, uncompressed: the Kafka sink compresses only if told to, and then
    this check is off, see :meth:`refusal`), and a record without a key on a compacted
    topic. Limits are read with DescribeConfigs, cached for :data:`LIMITS_TTL_S`; a
    topic whose limits cannot be read is not checked (and that is logged once)."""

    def __init__(self, read: Callable[[str], TopicLimits | Exception]) -> None:
        self._read = read
        self._cache: dict[str, tuple[float, TopicLimits | None]] = {}
        self._lock = threading.Lock()

    def limits(self, topic: str) -> TopicLimits | None:
        with self._lock:
            cached = self._cache.get(topic)
            if cached is not None and time.monotonic() - cached[0] < LIMITS_TTL_S:
                return cached[1]
            found = self._read(topic)
            if isinstance(found, Exception):
                if cached is None:
                    log.warning(
                        "cannot read the destination's limits; its messages are sent "
                        "unchecked, and one it refuses fails the batch",
                        topic=topic,
                        error=str(found),
                    )
                limits = None
            else:
                limits = found
            self._cache[topic] = (time.monotonic(), limits)
            return limits

    def refusal(self, message: OutputRecord, *, compressed: bool = False) -> str | None:
        """Why the broker of ``message.topic`` would refuse it for good, or None."""
        limits = self.limits(message.topic)
        if limits is None:
            return None
        if message.key is None and limits.compacted:
            return f"destination topic {message.topic!r} is compacted and the message has no key"
        if not compressed and (
            single_record_batch_size_at_most(message.key, message.value, message.headers)
            > limits.max_message_bytes
        ):
            size = single_record_batch_size(message.key, message.value, message.headers)
            if size > limits.max_message_bytes:
                return (
                    f"message of {size} bytes is larger than destination topic "
                    f"{message.topic!r} accepts (max.message.bytes {limits.max_message_bytes})"
                )
        return None


_checks: dict[tuple[tuple[str, str], ...], DeliveryCheck] = {}


def _delivery_check(config: tuple[tuple[str, str], ...]) -> DeliveryCheck:
    """One DeliveryCheck per Python worker and admin configuration."""
    with _lookups_lock:
        check = _checks.get(config)
        if check is None:
            from confluent_kafka.admin import AdminClient

            admin = AdminClient(with_client_logs(dict(config)))

            def read(topic: str) -> TopicLimits | Exception:
                try:
                    return topic_limits(admin, [topic]).get(topic, KeyError(topic))
                except Exception as exc:  # noqa: BLE001 - any failure: unchecked, logged
                    return exc

            check = _checks[config] = DeliveryCheck(read)
        return check
