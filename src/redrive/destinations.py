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
        if topic.startswith("__") or topic == self.requests_topic:
            return False
        if self._names(topic):
            return True
        source = topic.removesuffix(_RETRY)
        if source == topic:
            return False
        # <group>.<source>.retry: the group and the source may both have dots in them.
        return any(
            self._names(source[dot + 1 :]) and not source[dot + 1 :].startswith("__")
            for dot in _dots(source)
        )

    def _names(self, topic: str) -> bool:
        return topic != self.requests_topic and any(
            fnmatch.fnmatchcase(topic, pattern) for pattern in self.patterns
        )


_RETRY: Final = ".retry"


def _dots(name: str) -> list[int]:
    """Where ``name`` may split into a group and a topic: after a non-empty group."""
    return [i for i, c in enumerate(name) if c == "." and 0 < i < len(name) - 1]
