"""The App's kept lines and the order it reads a batch in: a line put back behind its
key's new head keeps its order and its count (it held a place already), and a batch's
records that came back from a retry go first without any partition's records changing
order."""

from __future__ import annotations

from collections import defaultdict

import pytest
from confluent_kafka import Message as KafkaMessage
from hypothesis import given, settings
from hypothesis import strategies as st

from redrive.consumer.kept_lines import KeptLines
from redrive.consumer.loop import returns_first
from redrive.consumer.message import Message

pytestmark = pytest.mark.unit

WHERE = ("orders", 0)


def _message(offset: int, key: bytes = b"k") -> Message:
    return Message("orders", 0, offset, key, b"v", b"v", [], None, 1, None)


def test_the_rest_of_a_line_goes_back_behind_its_new_head_whole_and_in_order() -> None:
    kept = KeptLines(most=3)
    kept.start(WHERE, b"k")
    for offset in (1, 2, 3):
        assert kept.keep(_message(offset))
    assert not kept.keep(_message(4))  # the bound
    kept.ready_after(WHERE, b"k")
    _, line = kept.ready.popleft()
    assert line.popleft().offset == 1  # handled, and failed: the key's new head
    kept.start(WHERE, b"k")
    kept.put_back(WHERE, b"k", line)
    assert not line
    assert kept.offsets(WHERE) == [2, 3]
    assert kept.count() == 2
    assert kept.keep(_message(4))  # room for one more, as counted
    assert not kept.keep(_message(5))
    assert [m.offset for m in kept.take(WHERE, b"k")] == [2, 3, 4]
    assert kept.count() == 0


records = st.lists(
    st.tuples(st.sampled_from(["orders", "orders.retry", "users"]), st.integers(0, 2)),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(records)
def test_records_back_from_a_retry_go_first_and_each_partition_stays_in_order(
    read: list[tuple[str, int]],
) -> None:
    next_offset: dict[tuple[str, int], int] = defaultdict(int)
    batch = []
    for topic, partition in read:
        offset = next_offset[(topic, partition)]
        next_offset[(topic, partition)] += 1
        batch.append(KafkaMessage(topic=topic, partition=partition, offset=offset))
    returns = frozenset({"orders.retry"})
    ordered = returns_first(batch, returns)
    assert sorted(map(id, ordered)) == sorted(map(id, batch))
    topics = [record.topic() in returns for record in ordered]
    assert topics == sorted(topics, reverse=True)  # every return before any source
    seen: dict[tuple[str | None, int | None], int] = {}
    for record in ordered:
        where = (record.topic(), record.partition())
        assert record.offset() == seen.get(where, -1) + 1
        seen[where] = record.offset()  # type: ignore[assignment]
