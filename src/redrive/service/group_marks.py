"""Which store a requests group reads into, as the metadata of its commits says.

Kafka keeps a string with each committed offset, which every member of the group,
and any process that knows the group's name, can read. Intake writes its store's id
there with every commit (:func:`settled`): the group's requests go to that store.

A store takes a group that no store holds yet in two steps, because two services on
two databases may start at once on a fresh group, each assigned part of it:

1. it writes a *claim* (:func:`claim`) on the partitions it was assigned, then reads
   the marks of all of them again;
2. if no other store's mark is there, it settles its partitions (writes
   :func:`settled`) and reads them; else it takes its claims back and refuses.

Each writes before it reads again, so of two stores claiming at once the later
reader sees the other's claim: at most one goes on (both may refuse, having stored
nothing). A store with a settled mark is past step 2: a claim of another store it
finds later was written after its own marks were there, so that store sees them and
refuses; the claim is ignored, and written over when its partition comes. A claim
lives for the moment a start-up takes: one older than :data:`CLAIM_EXPIRY_MS` was
left by a service that stopped between its claim and taking it back.

Anything else in the metadata (an older redrive commits none) names no store: such
a group is taken as a fresh one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

Partition = tuple[str, int]

SETTLED: Final = "redrive-store:"
CLAIM: Final = "redrive-claim:"
CLAIM_EXPIRY_MS: Final = 10 * 60_000
"""After this, a claim is taken for one its maker left behind. A start-up's claim is
settled or taken back within seconds; the margin covers the clocks of two hosts."""

_SETTLED = re.compile(r"redrive-store:([0-9a-f]{32})")
_CLAIM = re.compile(r"redrive-claim:([0-9a-f]{32}):([0-9]{1,15})")


@dataclass(frozen=True)
class Mark:
    """A store named in a committed offset's metadata."""

    store: str
    claimed_ms: int | None = None
    """When the store claimed the partition (epoch ms); None once it settled."""

    @property
    def settled(self) -> bool:
        return self.claimed_ms is None


@dataclass(frozen=True)
class OtherStore:
    """Another store the group's marks name, and where."""

    store: str
    settled: bool
    """True: it holds the group. False: it is claiming it at this moment."""
    partitions: tuple[Partition, ...]
    claimed_ms: int | None = None
    """The latest of its claims, when it is claiming."""


def settled(store: str) -> str:
    """The metadata of a commit by a service of `store` that holds its group."""
    return f"{SETTLED}{store}"


def claim(store: str, now_ms: int) -> str:
    """The metadata of `store`'s claim on a partition, made at `now_ms`."""
    return f"{CLAIM}{store}:{now_ms}"


def read(metadata: str | None) -> Mark | None:
    """The store a commit's metadata names, or None if it names none."""
    if not metadata:
        return None
    found = _SETTLED.fullmatch(metadata)
    if found:
        return Mark(found.group(1))
    found = _CLAIM.fullmatch(metadata)
    if found:
        return Mark(found.group(1), int(found.group(2)))
    return None


def held_by(marks: Mapping[Partition, Mark | None], store: str) -> bool:
    """Whether `store` holds the group: a mark of its own is settled."""
    return any(mark is not None and mark.settled and mark.store == store for mark in marks.values())


def other_store(marks: Mapping[Partition, Mark | None], me: str, now_ms: int) -> OtherStore | None:
    """The store other than `me` that keeps `me` from reading the group, if any: one
    that holds it, else one claiming it now (not when `me` holds it; not a claim past
    :data:`CLAIM_EXPIRY_MS`). One holding it is named first, then the one on most
    partitions."""
    mine = held_by(marks, me)
    found: dict[tuple[str, bool], list[Partition]] = {}
    latest: dict[str, int] = {}
    for partition, mark in sorted(marks.items()):
        if mark is None or mark.store == me:
            continue
        if mark.claimed_ms is not None:
            if mine or now_ms - mark.claimed_ms > CLAIM_EXPIRY_MS:
                continue
            latest[mark.store] = max(latest.get(mark.store, 0), mark.claimed_ms)
        found.setdefault((mark.store, mark.settled), []).append(partition)
    if not found:
        return None
    (store, is_settled), partitions = max(
        found.items(), key=lambda item: (item[0][1], len(item[1]), item[0][0])
    )
    return OtherStore(store, is_settled, tuple(partitions), None if is_settled else latest[store])
