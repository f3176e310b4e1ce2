"""Which topics a retry request may deliver to: the destination allowlist.

The retry service (setting ``allowed_destinations``) and the Spark scheduler check
every request's ``redrive-destination`` with :class:`DestinationAllowlist`, so a
pattern means the same to both. Internal topics (``__*``) and the requests topic
itself are refused whatever the patterns say: a request must not write into
Kafka's own topics, nor loop back into the topic it came from.

A topic allowed brings its per-group retry topics (``<group>.<topic>.retry``) with it:
a consumer group's retries of an allowed topic come back there (``Service(ordering=
"key")`` by default), and writing there reaches only that group's readers of the topic,
where writing to the topic reaches them all.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from redrive.topic_names import per_group_retry_sources

_PATTERN: Final = re.compile(r"[a-zA-Z0-9._\-*?\[\]!]+")


def check_patterns(patterns: Sequence[str]) -> None:
    """Raise ValueError naming the first entry that is not a topic name or glob pattern."""
    for pattern in patterns:
        if not pattern or not _PATTERN.fullmatch(pattern):
            raise ValueError(f"{pattern!r} is not a topic name or glob pattern")


@dataclass(frozen=True, slots=True)
class DestinationAllowlist:
    """Topic names or glob patterns (``fnmatch``, case-sensitive) a request may target."""

    patterns: tuple[str, ...]
    requests_topic: str

    def allows(self, topic: str) -> bool:
        """True if a request may deliver to `topic`: a topic the patterns name, or a
        per-group retry topic of one."""
        return self._open(topic) and (
            self._named(topic) or any(self._named(t) for t in per_group_retry_sources(topic))
        )

    def _open(self, topic: str) -> bool:
        return not topic.startswith("__") and topic != self.requests_topic

    def _named(self, topic: str) -> bool:
        return self._open(topic) and any(fnmatch.fnmatchcase(topic, p) for p in self.patterns)
