"""How a pipeline writes what it makes: exactly once, or at least once through Spark's sink.

A pipeline's outputs (results, retry requests, dead letters) go to Kafka one of two
ways, chosen by a value of its own type rather than a flag:

- :class:`ExactlyOnce` (the default): each task writes its source partition's
  outputs in Kafka transactions that also record how far in the source they go
  (:mod:`redrive.spark.exactly_once`); a re-run of the task, after a task retry, a
  lost executor or a restart from the checkpoint, writes nothing twice, and
  ``read_committed`` readers see each record's outcome once;
- :class:`AtLeastOnce`: Spark's Kafka sink, as fast as it goes; a re-run batch
  writes its outputs again (the retry service drops repeated requests by their
  ``redrive-id``; results are repeated).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from redrive.headers import is_topic_name

PROGRESS_PREFIX: Final = "redrive-spark"


@dataclass(frozen=True)
class ExactlyOnce:
    """Transactional output, one transactional producer per source partition.

    ``name`` names the pipeline's transactional ids (``<name>.<topic>.<partition>``)
    and the consumer group in which its progress is committed (``<name>``); by
    default ``redrive-spark.<group>``. Two pipelines must not share it: each would
    fence the other. ``client_config`` is librdkafka configuration for the
    executors' producers (security settings...), besides the bootstrap servers.
    """

    name: str | None = None
    client_config: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name is not None and not is_topic_name(self.name):
            raise ValueError(
                f"exactly-once name {self.name!r}: use the characters of a topic name "
                "(a-z A-Z 0-9 . _ -)"
            )

    def name_for(self, group: str) -> str:
        """The name of the transactional ids and the progress group, for ``group``."""
        return self.name or f"{PROGRESS_PREFIX}.{group}"


@dataclass(frozen=True)
class AtLeastOnce:
    """Spark's Kafka sink: a re-run batch writes its outputs again."""


Delivery: TypeAlias = ExactlyOnce | AtLeastOnce

EXACTLY_ONCE: Final = ExactlyOnce()
"""The default of the pipeline and the scheduler."""
