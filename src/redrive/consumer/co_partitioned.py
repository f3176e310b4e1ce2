"""Key order across two topics: a partition and its namesake read by one instance.

Key order through retries keeps each key's state (its held key, or its line of copies)
with the App instance that reads the key's source partition. When a key's retries come
back on another topic (the tiers, or the service's per-group topic), partition ``p`` of
that topic must be read by the same instance as partition ``p`` of the source: the
topics have the same partition count, and the group's assignor gives a member the same
partitions of topics alike. librdkafka's ``range`` assignor does; ``roundrobin`` and
``cooperative-sticky`` may not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from redrive.errors import ConfigError


def check_assignor(
    topic: str, others: str, settings: Mapping[str, Any], otherwise: str | None = None
) -> None:
    """A ConfigError unless the consumer's assignor (``settings``: its librdkafka
    settings) keeps partition ``p`` of ``topic`` and of its ``others`` together
    (``otherwise``: another way out, for the error's fix)."""
    assignor = settings.get("partition.assignment.strategy")
    if assignor is not None and not str(assignor).replace(" ", "").startswith("range"):
        raise ConfigError(
            "partition.assignment.strategy",
            f"{assignor!r} may give a partition and its {others} to different "
            f"instances, whose key order for {topic!r} would then disagree",
            'leave it out (librdkafka\'s default starts with "range"), or use "range"'
            + (f", or {otherwise}" if otherwise else ""),
        )


def check_partition_count(topic: str, partitions: int, other: str, theirs: int) -> None:
    """A ConfigError unless a topic a key's retries come back on has the source's
    partition count (one made by the App has; one made beforehand may not)."""
    if theirs != partitions:
        raise ConfigError(
            f"topic {other!r}",
            f"has {theirs} partitions, {topic!r} has {partitions}: a key's retries would "
            "come back on a partition another instance may read, and its order be lost",
            f"give it {partitions} partitions, or delete it for the App to create",
        )
