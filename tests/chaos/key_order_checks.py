"""What the key-order chaos test (tests/chaos/test_key_order.py) reads from the
handler's calls: the outcome of each record, the order violations, the clean keys'
delays, the failed records they overtook, the retries under way."""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from tests.chaos.key_order_records import ATTEMPTS, SEQS, Plan


@dataclass
class Outcome:
    ok: dict[tuple[str, int], int]
    """(key, seq) -> the index (in the events file, i.e. call order) of its first success."""
    ok_calls: Counter[tuple[str, int]]
    first_ok_at: dict[tuple[str, int], int]
    ts: dict[tuple[str, int], int]
    dead_at: dict[tuple[str, int], int]
    """(key, seq) -> the index of its first dead-lettering call (fatal, or the last attempt)."""
    calls: int
    failed_calls: int
    back_ms: dict[int, int]
    """pid -> when that app process first called the handler."""
    partition: dict[tuple[str, int], int]
    """(key, seq) -> the partition it was produced to."""
    redelivered_ok: set[tuple[str, int]]
    """Records with a successful call on a redelivery (through the service or a tier)."""


def read_outcome(events: list[dict[str, Any]]) -> Outcome:
    ok: dict[tuple[str, int], int] = {}
    ok_calls: Counter[tuple[str, int]] = Counter()
    first_ok_at: dict[tuple[str, int], int] = {}
    ts: dict[tuple[str, int], int] = {}
    dead_at: dict[tuple[str, int], int] = {}
    back_ms: dict[int, int] = {}
    partition: dict[tuple[str, int], int] = {}
    redelivered_ok: set[tuple[str, int]] = set()
    failed = 0
    for index, event in enumerate(events):
        back_ms.setdefault(event["pid"], event["at_ms"])
        if event.get("seq") is None:
            continue
        ks = (event["key"], event["seq"])
        partition.setdefault(ks, event["partition"])
        ts.setdefault(ks, event["ts_ms"])
        if event["event"] == "ok":
            ok_calls[ks] += 1
            if event["due_ms"] is not None:
                redelivered_ok.add(ks)
            if ks not in ok:
                ok[ks] = index
                first_ok_at[ks] = event["at_ms"]
        else:
            failed += 1
            if event.get("fatal") or event["attempt"] >= ATTEMPTS:
                dead_at.setdefault(ks, index)
    return Outcome(
        ok,
        ok_calls,
        first_ok_at,
        ts,
        dead_at,
        len(events),
        failed,
        back_ms,
        partition,
        redelivered_ok,
    )


def order_violations(plan: Plan, outcome: Outcome) -> list[str]:
    """Keys whose successful calls are out of order, or overtook a lower seq's dead letter."""
    problems = []
    by_key: dict[str, list[int]] = defaultdict(list)
    for key, seq in plan.values:
        by_key[key].append(seq)
    for key, seqs in sorted(by_key.items()):
        before = -1  # the call index every later seq's first success must come after
        before_seq = None
        for seq in sorted(seqs):
            ks = (key, seq)
            if ks in outcome.ok:
                if outcome.ok[ks] < before:
                    problems.append(f"{key}:{seq:02d} handled before {key}:{before_seq:02d}")
                before, before_seq = max(before, outcome.ok[ks]), seq
            elif ks in outcome.dead_at:
                if outcome.dead_at[ks] < before:
                    problems.append(f"{key}:{seq:02d} dead-lettered before {key}:{before_seq:02d}")
                before, before_seq = max(before, outcome.dead_at[ks]), seq
    return problems


def clean_delays(
    plan: Plan, outcome: Outcome, outages: list[tuple[int, int]]
) -> tuple[float, float, int]:
    """Production to first success of the records of keys that never failed: the
    longest (s), the longest of those no app outage touched (s), how many records."""
    worst = quiet = 0.0
    count = 0
    for key in plan.clean_keys:
        for seq in range(SEQS):
            ks = (key, seq)
            if ks not in outcome.ok:
                continue
            count += 1
            start, end = outcome.ts[ks], outcome.first_ok_at[ks]
            delay = (end - start) / 1000
            worst = max(worst, delay)
            if not any(start <= back and end >= down for down, back in outages):
                quiet = max(quiet, delay)
    return worst, quiet, count


def overtakes(plan: Plan, outcome: Outcome) -> int:
    """Failed records that a later record of a clean key on their partition overtook:
    produced after the failed one, handled before it succeeded or was dead-lettered.
    A blocked partition has none."""
    clean = plan.clean_keys
    firsts: dict[int, list[tuple[int, int]]] = defaultdict(list)  # partition -> (ts, index)
    for ks, index in outcome.ok.items():
        if ks[0] in clean:
            firsts[outcome.partition[ks]].append((outcome.ts[ks], index))
    # Per partition, by production time: the earliest handling of anything produced later.
    earliest_after: dict[int, tuple[list[int], list[int]]] = {}
    for part, pairs in firsts.items():
        pairs.sort()
        stamps = [stamp for stamp, _ in pairs]
        suffix = [index for _, index in pairs]
        for i in range(len(suffix) - 2, -1, -1):
            suffix[i] = min(suffix[i], suffix[i + 1])
        earliest_after[part] = (stamps, suffix)
    count = 0
    for ks, value in plan.values.items():
        if value.count(":") < 2 or ks not in outcome.partition:
            continue  # never fails
        resolved = outcome.ok.get(ks, outcome.dead_at.get(ks))
        stamps, suffix = earliest_after.get(outcome.partition[ks], ([], []))
        produced = outcome.ts.get(ks)
        if resolved is None or produced is None:
            continue
        later = bisect.bisect_right(stamps, produced)
        if later < len(suffix) and suffix[later] < resolved:
            count += 1
    return count


def in_flight(events: list[dict[str, Any]], plan: Plan) -> int:
    """Records that failed, will succeed, and have not yet: retries under way."""
    failed: set[str] = set()
    done: set[str] = set()
    for event in events:
        (done if event["event"] == "ok" else failed).add(event["value"])
    dead = {plan.values[ks] for ks in plan.dead}
    return len(failed - done - dead)
