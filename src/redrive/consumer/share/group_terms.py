"""What a share group's configuration promises a consumer: how long a record stays
acquired, and how often the broker delivers it before giving up on it.

Read once at start-up from the group's configuration (``share.record.lock.duration.ms``,
``share.delivery.count.limit``: group settings that default to the broker's
``group.share.*`` ones). A group whose configuration cannot be read (no DESCRIBE_CONFIGS
on it) gets Kafka's defaults, and the log says so: a lock shorter than assumed is
noticed later, as a handler that outlived it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import structlog
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType

log = structlog.get_logger("redrive.share")

LOCK_SETTING = "share.record.lock.duration.ms"
LIMIT_SETTING = "share.delivery.count.limit"
DEFAULT_LOCK_MS = 30_000
DEFAULT_DELIVERY_LIMIT = 5


@dataclass(frozen=True, slots=True)
class GroupTerms:
    lock_ms: int
    """How long a delivered record stays acquired by its consumer."""
    delivery_limit: int
    """Deliveries after which the broker archives a record (or dead-letters it, KIP-1191)."""

    @property
    def margin_s(self) -> float:
        """How long before its lock runs out a record is no longer started: a tenth of
        the lock (3 s of Kafka's 30 s), time for the handler's last steps and the
        acknowledgement to reach the broker."""
        return self.lock_ms / 10_000


def read_terms(admin: AdminClient, group: str, timeout_s: float = 15.0) -> GroupTerms:
    resource = ConfigResource(ResourceType.GROUP, group)
    try:
        entries = admin.describe_configs([resource])[resource].result(timeout=timeout_s)
        values = {name: entry.value for name, entry in entries.items()}
        return GroupTerms(
            int(values.get(LOCK_SETTING) or DEFAULT_LOCK_MS),
            int(values.get(LIMIT_SETTING) or DEFAULT_DELIVERY_LIMIT),
        )
    except (KafkaException, TimeoutError, ValueError) as exc:
        log.warning(
            "cannot read the share group's configuration; assuming Kafka's defaults",
            group=group,
            error=str(exc),
            lock_ms=DEFAULT_LOCK_MS,
            delivery_limit=DEFAULT_DELIVERY_LIMIT,
        )
        return GroupTerms(DEFAULT_LOCK_MS, DEFAULT_DELIVERY_LIMIT)


def configure_group(admin: AdminClient, group: str, settings: Mapping[str, str]) -> None:
    """Set a share group's configuration (``share.auto.offset.reset``,
    ``share.record.lock.duration.ms``...), as ``kafka-configs --entity-type groups``
    does; the group needs no member yet. Raises KafkaException if the broker refuses."""
    entries = [
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        for name, value in settings.items()
    ]
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)
