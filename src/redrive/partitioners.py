"""Where redrive's producers put a record that names no partition: by its key.

Kafka clients disagree on which partition a key belongs to. The Java producer (and
so Kafka Streams, Connect, Spring Kafka and Spark's Kafka sink) hashes the key with
murmur2; librdkafka, and so confluent-kafka, by default with CRC32
(``consistent_random``). A key that redrive placed the librdkafka way lands on
another partition than the one its Java-written records are on: its per-key order is
lost, and Kafka Streams' co-partitioned joins miss it.

So every producer redrive makes names librdkafka's partitioner, by default
``murmur2_random``: the Java producer's placement (murmur2 of the key, modulo the
partition count; a record without a key spread). librdkafka computes it: redrive
never works out a partition from a key itself. The choice is one setting (the retry
service's ``partitioner``, ``App(partitioner=...)``), never a raw librdkafka
``partitioner`` among other client settings, where two ways of saying it could
disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final, Literal, get_args

from redrive.errors import ConfigError


class Partitioner(StrEnum):
    """librdkafka's partitioners that place a record by its key. The ``_random`` ones
    spread records without a key over the partitions; the others put them all in one.
    (librdkafka's ``random``, which ignores the key, is left out: a key's records
    would be scattered.)"""

    MURMUR2_RANDOM = "murmur2_random"
    """The Java producer's placement: the default."""
    MURMUR2 = "murmur2"
    CONSISTENT_RANDOM = "consistent_random"
    """librdkafka's own default (CRC32 of the key): confluent-kafka's, kcat's..."""
    CONSISTENT = "consistent"
    FNV1A_RANDOM = "fnv1a_random"
    """FNV-1a of the key."""
    FNV1A = "fnv1a"


PartitionerName = Literal[
    "murmur2_random", "murmur2", "consistent_random", "consistent", "fnv1a_random", "fnv1a"
]
"""A partitioner by its name, for callers that write a string."""

DEFAULT_PARTITIONER: Final = Partitioner.MURMUR2_RANDOM

RAW_SETTINGS: Final = ("partitioner", "topic.partitioner")
"""librdkafka's names for the setting (the second, its topic-level spelling)."""


def placed_by(partitioner: Partitioner) -> dict[str, str]:
    """The producer setting that has librdkafka place records by ``partitioner``."""
    return {"partitioner": partitioner.value}


def partitioner_named(value: object, setting: str) -> Partitioner:
    """``value`` (a Partitioner or its name) as a Partitioner; a ConfigError naming
    ``setting`` if it is neither."""
    if isinstance(value, str) and value in get_args(PartitionerName):
        return Partitioner(value)
    raise ConfigError(
        setting,
        f"{value!r} is not a partitioner that places records by their key",
        f"use one of {', '.join(get_args(PartitionerName))} "
        f"(default {DEFAULT_PARTITIONER.value}: the Java producer's placement)",
    )


def java_sink_places(partitioner: Partitioner, setting: str) -> None:
    """Spark's Kafka sink is the Java producer, which places by murmur2 (a record
    without a key spread): ``murmur2_random`` here. A ConfigError naming ``setting``
    if it was asked to place otherwise, which it cannot."""
    if partitioner is not Partitioner.MURMUR2_RANDOM:
        raise ConfigError(
            setting,
            f"{partitioner.value!r}: Spark's Kafka sink is the Java producer, which "
            "places keys with murmur2 only (murmur2_random)",
            "leave it unset, or set murmur2_random, for the Spark commands",
        )


def raw_partitioner(config: Mapping[str, Any]) -> str | None:
    """The librdkafka setting in ``config`` that would choose the partitioner, if any
    (also inside the deprecated ``default.topic.config``)."""
    for name in RAW_SETTINGS:
        if name in config:
            return name
    nested = config.get("default.topic.config")
    if isinstance(nested, Mapping) and (inner := raw_partitioner(nested)) is not None:
        return f"default.topic.config.{inner}"
    return None
