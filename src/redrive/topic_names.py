"""Topic names redrive chooses: the defaults, and the names it derives from a topic.

The library, the retry service and the Spark pipeline must agree on these, or a
retry is delivered where no one reads it. Whether a name is legal at all is the
header contract's rule (:func:`redrive.headers.is_topic_name`, at most
:data:`redrive.headers.MAX_TOPIC_LENGTH` characters).
"""

from __future__ import annotations

from typing import Final

REQUESTS_TOPIC: Final = "redrive.requests"
"""Where consumers send retry requests for the retry service (or the Spark scheduler)."""

DLQ_TOPIC: Final = "redrive.dlq"
"""Where the retry service mirrors its dead letters, and the Spark scheduler writes its."""


def dead_letter_topic(topic: str) -> str:
    """The in-app strategies' dead-letter topic of ``topic``: ``<topic>.dlq``."""
    return f"{topic}.dlq"


def per_group_retry_topic(group: str, topic: str) -> str:
    """The per-group retry topic of ``topic``: ``<group>.<topic>.retry``, read by that
    group only, so other consumer groups of ``topic`` never see its retries."""
    return f"{group}.{topic}.retry"


def per_group_retry_sources(name: str) -> list[str]:
    """The topics ``name`` may be the per-group retry topic of (groups and topics may
    both have dots in them): ``a.b.retry`` -> ``["b"]``; none if it is not one."""
    inner = name.removesuffix(".retry")
    if inner == name:
        return []
    return [inner[i + 1 :] for i, c in enumerate(inner) if c == "." and 0 < i < len(inner) - 1]


def tier_topic(group: str, topic: str, delay: str) -> str:
    """The ``topics`` strategy's tier of ``topic`` for one delay (``5m``, as
    :func:`redrive.policy.format_duration` writes it) in consumer group ``group``:
    ``<group>.<topic>.retry.<delay>``. Per group, as the per-group retry topic: a tier
    holds one group's retries, which another group reading ``topic`` must never see."""
    return f"{group}.{topic}.retry.{delay}"


def single_retry_topic(group: str, topic: str) -> str:
    """The ``retry-topic`` strategy's one retry topic of ``topic`` in consumer group
    ``group``: ``<group>.<topic>.retry.all``, every retry whatever its delay. Per group,
    as a tier. It cannot be one of the ``topics`` strategy's tiers, whose last part is a
    duration (``5m``), nor the per-group retry topic ``<group>.<topic>.retry``."""
    return f"{group}.{topic}.retry.all"


def held_keys_topic(group: str, topic: str) -> str:
    """Where an App keeping key order (``ordering="key"``) writes which keys of ``topic``
    wait in the retry service for group ``group``: ``<group>.<topic>.held``, compacted,
    one partition per partition of ``topic`` (see :mod:`redrive.consumer.held_keys`)."""
    return f"{group}.{topic}.held"
