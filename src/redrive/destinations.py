"""Which topics a retry request may deliver to: the destination allowlist.

The retry service (setting ``allowed_destinations``) and the Spark scheduler check
every request's ``redrive-destination`` with :class:`DestinationAllowlist`, so a
pattern means the same to both. Internal topics (``__*``) and the requests topic
itself are refused whatever the patterns say: a request must not write into
Kafka's own topics, nor loop back into the topic it came from.
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
        """True if a request may deliver to `topic`."""
        if topic.startswith("__") or topic == self.requests_topic:
            return False
        return any(fnmatch.fnmatchcase(topic, pattern) for pattern in self.patterns)
