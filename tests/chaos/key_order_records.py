"""The records of the key-order chaos test (tests/chaos/test_key_order.py): what each
does in the handler, and when each goes out. Two plans: sporadic failures
(:func:`plan_records`) and a downstream outage on top of them (:func:`plan_outage`)."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from confluent_kafka import Producer

from tests.chaos.harness import MODE

KEYS = 1000 if MODE.name == "long" else 400
SEQS = 20
PRODUCE_S = 90.0 if MODE.name == "long" else 20.0
"""Production spans this long (see :func:`schedule`)."""
BURSTS = 4
POLICY = "200ms x3"
ATTEMPTS = 4  # the first call and 3 retries: `:f3` succeeds at the last, `:f9` never
OUTAGE = (0.35, 0.65)
"""The downstream outage's stretch of the production time, as fractions of PRODUCE_S."""
OUTAGE_SPARED = 0.25
"""The share of keys whose downstream stays up through the outage."""


def marker(rng: random.Random) -> str:
    """What the handler does with a record (see app_process.py): ~6.5% of records fail,
    which makes ~10% of the handler's calls fail."""
    roll = rng.random()
    if roll < 0.035:
        return ":f1"
    if roll < 0.050:
        return rng.choice([":f2", ":f3"])
    if roll < 0.058:
        return ":x"
    if roll < 0.065:
        return ":f9"
    return ""


def outage_marker(rng: random.Random) -> str:
    """What the handler does with a record produced while its downstream is down: it
    always fails, mostly a few times and then succeeds; some fatally (a refusal) or
    on every attempt (still down when the attempts run out): ~1.6 failed calls each."""
    roll = rng.random()
    if roll < 0.55:
        return ":f1"
    if roll < 0.80:
        return ":f2"
    if roll < 0.90:
        return ":f3"
    if roll < 0.95:
        return ":x"
    return ":f9"


@dataclass(frozen=True)
class Plan:
    """The records of one run. What is derived from them is worked out once: the
    checks ask for it per record."""

    values: dict[tuple[str, int], str]
    """(key, seq) -> value, e.g. ("k0042", 7) -> "k0042:07:f1"."""

    @cached_property
    def dead(self) -> set[tuple[str, int]]:
        """The records that end as dead letters (`:x`, `:f9`)."""
        return {ks for ks, v in self.values.items() if v.endswith((":x", ":f9"))}

    @cached_property
    def clean_keys(self) -> set[str]:
        """The keys none of whose records fails."""
        failing = {k for (k, _), v in self.values.items() if v.count(":") > 1}
        return {k for k, _ in self.values} - failing

    @cached_property
    def keys(self) -> int:
        """How many keys the records have (:func:`schedule` spreads them)."""
        return len({k for k, _ in self.values})


def plan_records(rng: random.Random) -> Plan:
    """Sporadic failures: ~10% of the handler's calls fail."""
    values = {}
    for k in range(KEYS):
        key = f"k{k:04d}"
        for seq in range(SEQS):
            values[(key, seq)] = f"{key}:{seq:02d}{marker(rng)}"
    return Plan(values)


def plan_outage(rng: random.Random, keys: int = KEYS) -> Plan:
    """A downstream outage on top of the sporadic failures: every record produced in
    the OUTAGE stretch of the production time fails (:func:`outage_marker`), except
    those of the OUTAGE_SPARED keys (another downstream); ~30% of the handler's calls
    fail. The records' bursts are as in :func:`schedule`, so the outage holds whole
    bursts: each of its keys is held while the rest of its burst arrives."""
    spared = set(rng.sample(range(keys), round(keys * OUTAGE_SPARED)))
    start, end = (fraction * PRODUCE_S for fraction in OUTAGE)
    produced = {(key, seq): at for at, key, seqs in schedule(keys) for seq in seqs}
    values = {}
    for k in range(keys):
        key = f"k{k:04d}"
        for seq in range(SEQS):
            down = k not in spared and start <= produced[(key, seq)] < end
            values[(key, seq)] = f"{key}:{seq:02d}{outage_marker(rng) if down else marker(rng)}"
    return Plan(values)


def schedule(keys: int = KEYS) -> list[tuple[float, str, range]]:
    """When each burst of records goes out: (seconds after the start, key, seqs). A
    key's 20 records go in BURSTS bursts of consecutive seqs, PRODUCE_S / BURSTS apart;
    the keys' bursts are spread evenly over that interval. Within a burst the records
    follow each other closely: a failure holds the key while the rest of the burst
    arrives (they go behind it); between bursts the key is often free again."""
    size = SEQS // BURSTS
    slot = PRODUCE_S / BURSTS
    return sorted(
        ((burst + k / keys) * slot, f"k{k:04d}", range(burst * size, (burst + 1) * size))
        for k in range(keys)
        for burst in range(BURSTS)
    )


class Bursts(threading.Thread):
    """Produces the records on :func:`schedule`, from `started` (time.monotonic())."""

    def __init__(self, bootstrap: str, topic: str, plan: Plan) -> None:
        super().__init__(name="key-order-bursts", daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.plan = plan
        self.started = time.monotonic()
        self.error: BaseException | None = None
        self.acked = 0

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.error = exc

    def _run(self) -> None:
        producer = Producer(
            {"bootstrap.servers": self.bootstrap, "linger.ms": 5, "enable.idempotence": True}
        )

        def acked(err: Any, _msg: Any) -> None:
            if err is None:
                self.acked += 1

        for at, key, seqs in schedule(self.plan.keys):
            while (left := self.started + at - time.monotonic()) > 0:
                producer.poll(min(left, 0.1))
            for seq in seqs:
                value = self.plan.values[(key, seq)]
                while True:
                    try:
                        producer.produce(
                            self.topic, key=key.encode(), value=value.encode(), on_delivery=acked
                        )
                        break
                    except BufferError:
                        producer.poll(0.05)
                producer.poll(0)
        assert producer.flush(120) == 0, "records not acknowledged"
        producer.close()

    def finish(self, timeout_s: float = 180) -> int:
        self.join(timeout_s)
        if self.error is not None:
            raise self.error
        assert not self.is_alive(), "production did not end"
        return self.acked
