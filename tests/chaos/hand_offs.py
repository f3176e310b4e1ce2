"""What an App handed off to the retry service, as its readers see it: the requests
topic read from the start with ``read_committed`` (what intake and the Spark
scheduler read), each request by its kind and ``redrive-id``; and, for a hand-off
found more than once, where each copy is and what the App's group had committed
around it (:func:`describe_repeats`), to tell how it came to be made twice."""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition

from redrive.consumer import done_ahead
from redrive.headers import HeaderError, decode
from redrive.kafka import read_headers
from tests.chaos.offset_history import Commit


@dataclass(frozen=True)
class HandOff:
    """One request on the requests topic."""

    kind: str
    id: str | None
    partition: int
    """Where it is on the requests topic."""
    offset: int
    timestamp_ms: int
    """When its producer made it (CreateTime)."""
    original: tuple[str | None, int | None, int | None]
    """The record it names: original topic, partition, offset."""
    attempt: int


def kind_of(send_to: str, order: str | None) -> str:
    if send_to == "dlq":
        return "dead letter"
    return order if order in ("behind", "release") else "retry"


def read_hand_offs(bootstrap: str, topic: str, *, committed: bool = True) -> list[HandOff]:
    """Every request on ``topic``, in each partition's order: of committed
    transactions only (``committed``), or every record written (read_uncommitted:
    aborted ones too)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"hand-offs-{uuid.uuid4().hex}",
            "isolation.level": "read_committed" if committed else "read_uncommitted",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics[topic]
        partitions = [TopicPartition(topic, p, 0) for p in metadata.partitions]
        consumer.assign(partitions)
        open_partitions = {tp.partition for tp in partitions}
        found: list[HandOff] = []
        idle = 0
        while open_partitions and idle < 300:
            messages = consumer.consume(500, timeout=0.1)
            idle = idle + 1 if not messages else 0
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        open_partitions.discard(message.partition() or 0)
                    continue
                headers, _ = read_headers(message)
                where = (int(message.partition() or 0), int(message.offset() or 0))
                stamp = message.timestamp()[1]
                try:
                    request, _ = decode(headers)
                except HeaderError:
                    found.append(HandOff("unreadable", None, *where, stamp, (None, None, None), 0))
                    continue
                found.append(
                    HandOff(
                        kind_of(request.send_to, request.order),
                        request.id,
                        *where,
                        stamp,
                        (
                            request.original_topic,
                            request.original_partition,
                            request.original_offset,
                        ),
                        request.attempt,
                    )
                )
        assert not open_partitions, f"{topic}: partitions {open_partitions} not read to the end"
        return found
    finally:
        consumer.close()


def counted(found: Iterable[HandOff]) -> Counter[tuple[str, str | None]]:
    """(kind, redrive-id) -> how many times it is there."""
    return Counter((hand_off.kind, hand_off.id) for hand_off in found)


def committed_hand_offs(bootstrap: str, topic: str) -> Counter[tuple[str, str | None]]:
    """(kind, redrive-id) -> how many times it is on ``topic``, committed."""
    return counted(read_hand_offs(bootstrap, topic))


def repeated(found: Counter[tuple[str, str | None]]) -> dict[str, int]:
    """Per kind, how many hand-offs are there more than once (or without an id)."""
    twice: Counter[str] = Counter()
    for (kind, request_id), count in found.items():
        if count > 1 or request_id is None:
            twice[kind] += count - 1 if request_id is not None else count
    return dict(twice)


def describe_repeats(
    found: Sequence[HandOff],
    *,
    started_ms: int,
    kills: Sequence[int] = (),
    written: Sequence[HandOff] = (),
    commits: Sequence[Commit] = (),
    limit: int = 10,
) -> list[str]:
    """One line per hand-off committed more than once (at most ``limit``): its
    copies (requests partition@offset, made when, relative to ``started_ms`` and to
    the App's ``kills``, epoch ms), how many copies were written at all (``written``,
    read_uncommitted: aborted ones too), and what the group committed for the
    record's source partition around the copies (``commits``): the position, and
    whether the record was behind it or named done by its metadata."""
    copies: dict[tuple[str, str | None], list[HandOff]] = defaultdict(list)
    for hand_off in found:
        copies[(hand_off.kind, hand_off.id)].append(hand_off)
    all_written = counted(written)
    lines = []
    for (kind, request_id), these in copies.items():
        if len(these) < 2 and request_id is not None:
            continue
        if len(lines) >= limit:
            lines.append("...")
            break
        topic, partition, offset = these[0].original
        parts = [
            f"{kind} id={request_id} of {topic}[{partition}]@{offset} attempt {these[0].attempt}:"
            f" {len(these)} committed ({all_written.get((kind, request_id), '?')} written)"
        ]
        for copy in these:
            parts.append(
                f"  requests[{copy.partition}]@{copy.offset} made at "
                f"{_when(copy.timestamp_ms, started_ms, kills)}"
            )
        if topic is not None and partition is not None and offset is not None:
            # The partition's commits around the copies, from the last one that counted
            # before the first copy (where a run started from, had it started then).
            first = min(c.timestamp_ms for c in these)
            last = max(c.timestamp_ms for c in these) + 3_000
            theirs = [c for c in commits if (c.topic, c.partition) == (topic, partition)]
            before = [c for c in theirs if c.committed and c.timestamp_ms <= first]
            since = before[-1].timestamp_ms if before else first
            shown = [c for c in theirs if since <= c.timestamp_ms <= last]
            if len(shown) > 16:  # commits every 100 ms: the first and the last few
                parts.append(f"  ({len(shown) - 16} commits between not shown)")
                shown = shown[:4] + shown[-12:]
            for commit in shown:
                done = done_ahead.decode(commit.metadata, commit.offset)
                covers = (
                    "past it"
                    if offset < commit.offset
                    else "names it done"
                    if offset in done
                    else "NOT covering it"
                )
                state = "" if commit.committed else " (aborted or pending)"
                parts.append(
                    f"  commit {commit.offset} (+{len(done)} done) at "
                    f"{_when(commit.timestamp_ms, started_ms, kills)}: {covers}{state}"
                )
        lines.append("\n".join(parts))
    return lines


def _when(at_ms: int, started_ms: int, kills: Sequence[int]) -> str:
    since = f"+{(at_ms - started_ms) / 1000:.3f}s"
    before = [k for k in kills if k <= at_ms]
    after = [k for k in kills if k > at_ms]
    relative = []
    if before:
        relative.append(f"{(at_ms - before[-1]) / 1000:.3f}s after kill {len(before)}")
    if after:
        relative.append(f"{(after[0] - at_ms) / 1000:.3f}s before kill {len(before) + 1}")
    return since + (f" ({', '.join(relative)})" if relative else "")


def uncovered(found: Sequence[HandOff], commits: Sequence[Commit], topic: str) -> list[str]:
    """Records put behind whose committed hand-off a later committed position of their
    partition does not cover (the record neither before the position nor named done
    by its metadata): were the App to start from that position, it would put the
    record behind again. Empty when the exactly-once invariant held throughout; a
    line per record otherwise (the hand-off, and the first commit that lost it).

    A commit made after the hand-off (by the broker's clock, the hand-off's
    CreateTime by the App's, one machine's) is of the hand-off's transaction or a later
    one: every such commit that counted must cover it."""
    by_partition: dict[int, list[Commit]] = defaultdict(list)
    for commit in commits:
        if commit.topic == topic and commit.committed:
            by_partition[commit.partition].append(commit)
    problems = []
    for hand_off in found:
        if hand_off.kind != "behind" or hand_off.original[0] != topic:
            continue
        partition, offset = hand_off.original[1], hand_off.original[2]
        if partition is None or offset is None:
            continue
        for commit in by_partition.get(partition, []):
            if commit.timestamp_ms <= hand_off.timestamp_ms:
                continue
            done = done_ahead.decode(commit.metadata, commit.offset)
            if offset < commit.offset or offset in done:
                continue
            later_ms = commit.timestamp_ms - hand_off.timestamp_ms
            problems.append(
                f"{topic}[{partition}]@{offset} put behind at {hand_off.timestamp_ms} "
                f"(requests[{hand_off.partition}]@{hand_off.offset}), not covered by the commit "
                f"{commit.offset} (+{len(done)} done) at {commit.timestamp_ms}, {later_ms} ms later"
            )
            break
    return problems
