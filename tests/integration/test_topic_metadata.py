"""The destination check's topic cache, on the real broker: a topic created a moment
after another topic's miss refreshed the cache is found, not called missing, and a run
of requests for one missing topic costs one metadata request."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from redrive.topic_admin import TopicMetadata

pytestmark = pytest.mark.integration


class CountingAdmin(AdminClient):  # type: ignore[misc]
    """The real admin client, counting its metadata requests."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.lookups = 0

    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        self.lookups += 1
        return super().list_topics(*args, **kwargs)


def test_a_topic_created_just_after_another_topics_miss_is_found(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    metadata = TopicMetadata(CountingAdmin({"bootstrap.servers": bootstrap}))
    assert metadata.partitions_of(f"absent-{uuid.uuid4().hex}") is None
    created = new_topic("fresh", partitions=3)  # within the second after that miss
    assert metadata.partitions_of(created) == 3


def test_misses_of_one_topic_in_a_row_cost_one_metadata_request(bootstrap: str) -> None:
    admin = CountingAdmin({"bootstrap.servers": bootstrap})
    metadata = TopicMetadata(admin, miss_refresh_s=60)
    absent = f"absent-{uuid.uuid4().hex}"
    assert [metadata.partitions_of(absent) for _ in range(100)] == [None] * 100
    assert admin.lookups == 1
    assert metadata.partitions_of(f"absent-{uuid.uuid4().hex}") is None
    assert admin.lookups == 2, "another topic is looked up on its own"
