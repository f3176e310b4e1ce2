"""The topics the Spark scheduler reads and writes: made when missing, as ``redrive
serve`` makes them, and the size of the largest request it may have to pass on."""

from __future__ import annotations

from collections.abc import Mapping

from redrive.client_logs import with_client_logs


def ensure_topics(admin_config: Mapping[str, str], topics: Mapping[str, int]) -> None:
    """Create the topics (name -> partitions) that do not exist yet."""
    from confluent_kafka.admin import AdminClient

    from redrive.topic_admin import ensure_topic

    admin = AdminClient(with_client_logs(admin_config))
    for topic, partitions in topics.items():
        ensure_topic(admin, topic, partitions, {})


def request_size_limit(admin_config: Mapping[str, str], requests_topic: str) -> int:
    """The producer size limit for messages read from ``requests_topic``."""
    from confluent_kafka.admin import AdminClient

    from redrive.sizes import producer_size_limit

    admin = AdminClient(with_client_logs(admin_config))
    return producer_size_limit(admin, [requests_topic])["message.max.bytes"]
