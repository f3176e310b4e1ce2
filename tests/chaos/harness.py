"""Helpers for the fault tests: the mode (short or long), the records of a steady load
(the load itself, with a counter of every message the broker acknowledged, is
service_harness.Load), the retry service and consumer apps as real processes that can
be SIGKILLed, the hand-offs and deliveries in a topic counted by `redrive-id` (read
committed), and the report each test prints.

`REDRIVE_CHAOS=long` selects the long mode (bigger load, more kills, longer outages);
anything else the short one. `REDRIVE_CHAOS_SEED` overrides the seed of the injected
randomness (when to kill, how long to stay down, which records fail); every test
prints the seed it ran with, so a failing run can be repeated.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from redrive import headers as h
from redrive.deadlines import Deadline
from redrive.service.config import ServiceSettings
from tests.integration.service_harness import ChildProcess, Record, ServiceProcess


@dataclass(frozen=True)
class Mode:
    name: str
    # 1. the retry service SIGKILLed under load
    service_kills: int
    service_load_s: float
    service_rate: int
    # 2. the Kafka broker stopped and restarted
    broker_outages: int
    broker_outage_s: float
    broker_load_s: float
    # 3. PostgreSQL stopped and restarted
    pg_outages: int
    pg_outage_s: float
    pg_load_s: float
    # 4. a consumer app SIGKILLed in the middle of retries
    app_kills: int
    app_load_s: float
    app_rate: int
    # how long everything may take to arrive once the faults are over
    settle_s: float
    test_timeout_s: int


SHORT = Mode(
    name="short",
    service_kills=3,
    service_load_s=16,
    service_rate=150,
    broker_outages=1,
    broker_outage_s=6,
    broker_load_s=20,
    pg_outages=1,
    pg_outage_s=8,
    pg_load_s=18,
    app_kills=1,
    app_load_s=10,
    app_rate=20,
    settle_s=150,
    test_timeout_s=600,
)
LONG = Mode(
    name="long",
    service_kills=8,
    service_load_s=120,
    service_rate=300,
    broker_outages=2,
    broker_outage_s=25,
    broker_load_s=150,
    pg_outages=2,
    pg_outage_s=30,
    pg_load_s=150,
    app_kills=4,
    app_load_s=80,
    app_rate=40,
    settle_s=420,
    test_timeout_s=1800,
)
MODE = LONG if os.environ.get("REDRIVE_CHAOS", "").strip().lower() == "long" else SHORT
SEED = int(os.environ.get("REDRIVE_CHAOS_SEED", "20240917"))

# librdkafka's default session timeout is 45 s: a SIGKILLed member blocks its group's
# next rebalance that long. Every client here uses the broker's minimum so a restart
# takes seconds; the outcome (nothing lost) does not depend on it, only the runtime.
FAST_GROUP = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}


def rng_for(case: str) -> random.Random:
    """The seeded randomness of one test case (independent of the order tests run in)."""
    return random.Random(f"{SEED}/{case}")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def failures_for(rng: random.Random) -> int:
    """How many times a record fails before it succeeds: 0 (60%), 1 or 2 (20% each)."""
    roll = rng.random()
    return 0 if roll < 0.6 else 1 if roll < 0.8 else 2


# ---------------------------------------------------------------------- load

# The steady load itself is service_harness.Load (the recovery test uses it too).


def app_records(prefix: str, rng: random.Random) -> Callable[[int], Record]:
    """Records for a consumer app: value `<prefix>-<n>:f<failures>`."""

    def make(i: int) -> Record:
        return {
            "key": f"k{i % 31}".encode(),
            "value": f"{prefix}-{i:06d}:f{failures_for(rng)}".encode(),
        }

    return make


# ---------------------------------------------------------------------- processes


def wait_for(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = Deadline(timeout_s)
    while not deadline.passed():
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def sleep_until(t0: float, at_s: float, pump: Callable[[], None] | None = None) -> None:
    """Wait until `at_s` seconds after `t0`, calling `pump` (e.g. a collector) meanwhile."""
    while (left := t0 + at_s - time.monotonic()) > 0:
        if pump is None:
            time.sleep(min(left, 0.2))
        else:
            pump()


def readyz(port: int) -> int | None:
    """The service's /readyz status code, or None if it did not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


_LISTENING = re.compile(r"redrive serve: listening on http://[^:]+:(\d+)")


class Service:
    """`redrive serve` as a real process, restarted as often as a test kills it.

    Each instance writes its own log (serve-<n>.log), which `ServiceProcess.start`
    needs: it waits for the listening line in the log."""

    def __init__(self, settings: ServiceSettings, folder: Path) -> None:
        self.settings = settings
        self.folder = folder
        self.instances = 0
        self.process: ServiceProcess | None = None
        self.port = 0

    def start(self) -> None:
        self.instances += 1
        log = self.folder / f"serve-{self.instances}.log"
        process = ServiceProcess(self.settings, log)
        process.start()
        self.process = process
        match = _LISTENING.search(log.read_text(errors="replace"))
        assert match, "the listening line names no port"
        self.port = int(match.group(1))

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()

    def terminate(self) -> int:
        assert self.process is not None
        return self.process.terminate()

    def alive(self) -> bool:
        process = self.process
        return process is not None and process.proc is not None and process.proc.poll() is None

    def ready(self, timeout_s: float) -> bool:
        """True once /readyz answers 200 (no manual step: the service recovers alone)."""
        return wait_for(lambda: readyz(self.port) == 200, timeout_s, 0.5)

    def logs(self) -> str:
        return "\n".join(
            (self.folder / f"serve-{i}.log").read_text(errors="replace")
            for i in range(1, self.instances + 1)
        )


APP_SCRIPT = Path(__file__).with_name("app_process.py")


@dataclass
class AppProcess(ChildProcess):
    """tests/chaos/app_process.py as a real process; every run appends to one events file."""

    bootstrap: str
    topic: str
    strategy: str
    group: str
    requests_topic: str
    folder: Path
    policy: str = "200ms x8"
    session_timeout_ms: str = FAST_GROUP["session.timeout.ms"]
    instance_id: str | None = None
    transactional: bool = False
    ordering: str | None = None
    dead_letters: str | None = None
    async_handler: bool = False
    runs: int = 0
    proc: subprocess.Popen[bytes] | None = None
    pids: list[int] = field(default_factory=list)

    @property
    def events_file(self) -> Path:
        return self.folder / f"{self.strategy}-events.jsonl"

    def start(self) -> None:
        self.runs += 1
        log = open(self.folder / f"app-{self.strategy}-{self.runs}.log", "ab")  # noqa: SIM115
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(APP_SCRIPT),
                "--bootstrap",
                self.bootstrap,
                "--topic",
                self.topic,
                "--strategy",
                self.strategy,
                "--group",
                self.group,
                "--requests-topic",
                self.requests_topic,
                "--out",
                str(self.events_file),
                "--policy",
                self.policy,
                "--session-timeout-ms",
                self.session_timeout_ms,
                *(["--instance-id", self.instance_id] if self.instance_id else []),
                *(["--transactional"] if self.transactional else []),
                *(["--ordering", self.ordering] if self.ordering else []),
                *(["--dead-letters", self.dead_letters] if self.dead_letters else []),
                *(["--async"] if self.async_handler else []),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.pids.append(self.proc.pid)

    def events(self) -> list[dict[str, Any]]:
        try:
            text = self.events_file.read_text()
        except FileNotFoundError:
            return []
        events = []
        for line in text.splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue  # cannot happen with single appends, but never trip on it
        return events

    def handled(self) -> Counter[bytes]:
        """How many times each value was handled successfully."""
        return Counter(e["value"].encode() for e in self.events() if e["event"] == "ok")

    def early(self) -> int:
        """Redeliveries handled before their redrive-retry-at (never allowed)."""
        return sum(1 for e in self.events() if e["due_ms"] and e["at_ms"] < e["due_ms"])

    def in_retry(self) -> set[str]:
        """Values that failed and have not succeeded yet: retries in flight right now."""
        failed: set[str] = set()
        done: set[str] = set()
        for event in self.events():
            (done if event["event"] == "ok" else failed).add(event["value"])
        return failed - done

    def repeated_calls(self, values: Iterable[bytes] | None = None) -> int:
        """Handler calls of a record at an attempt it was called at before: the same
        record handled again (after a crash, from the committed offset) or a repeat
        delivery of its retry that reached the handler (`values`: only those)."""
        wanted = None if values is None else {v.decode() for v in values}
        calls = Counter(
            (e["value"], e["attempt"])
            for e in self.events()
            if wanted is None or e["value"] in wanted
        )
        return sum(n - 1 for n in calls.values() if n > 1)

    def logged(self, text: str) -> int:
        """Lines of every run's log that say `text` (e.g. "repeat delivery skipped")."""
        count = 0
        for run in range(1, self.runs + 1):
            path = self.folder / f"app-{self.strategy}-{run}.log"
            try:
                count += sum(text in line for line in path.read_text(errors="replace").splitlines())
            except OSError:
                continue
        return count

    def log_tail(self, lines: int = 40) -> str:
        path = self.folder / f"app-{self.strategy}-{self.runs}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


# ---------------------------------------------------------------------- hand-offs


@dataclass(frozen=True)
class Request:
    """A record with a `redrive-id` (a retry request, a tier record, or the service's
    delivery of one): its id and the failure it names."""

    id: str
    group: str | None
    origin: tuple[str | None, int | None, int | None]  # original topic, partition, offset
    attempt: int | None
    partition: int
    offset: int


def _int(value: bytes | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def committed_requests(
    bootstrap: str, topics: Iterable[str], timeout_s: float = 60
) -> list[Request]:
    """Every record with a `redrive-id` in `topics`, from the beginning to the end of
    each partition, reading committed records only (`isolation.level=read_committed`,
    as the retry service's intake and the App's tier consumer read: a hand-off of an
    aborted or open transaction is not counted). Call it once the writers stopped."""
    found: list[Request] = []
    for msg in _read_committed(bootstrap, topics, timeout_s):
        fields, _ = h.split_headers(msg.headers())
        request_id = fields.get(h.ID)
        if request_id is None:
            continue  # a dead letter, a record of the load itself
        group = fields.get(h.GROUP)
        topic = fields.get(h.ORIGINAL_TOPIC)
        found.append(
            Request(
                request_id.decode(),
                group.decode() if group is not None else None,
                (
                    topic.decode() if topic is not None else None,
                    _int(fields.get(h.ORIGINAL_PARTITION)),
                    _int(fields.get(h.ORIGINAL_OFFSET)),
                ),
                _int(fields.get(h.ATTEMPT)),
                msg.partition(),
                msg.offset(),
            )
        )
    return found


def not_in_topic(bootstrap: str, topic: str, sent: set[bytes]) -> set[bytes]:
    """The records of `sent` (acknowledged to the load's producer) that `topic` does not
    hold. redrive never removes a record from a source topic, so these never reached
    the App: a producer's or broker's loss, reported apart from redrive's."""
    stored = {msg.value() for msg in _read_committed(bootstrap, [topic], 60)}
    return sent - stored


def _read_committed(bootstrap: str, topics: Iterable[str], timeout_s: float) -> Iterator[Message]:
    """The committed records of `topics`, each partition from its beginning to its end."""
    names = sorted(set(topics))
    if not names:
        return
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chaos-count-{time.time_ns()}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
        }
    )
    try:
        metadata = consumer.list_topics(timeout=30)
        wanted = [
            TopicPartition(name, partition, OFFSET_BEGINNING)
            for name in names
            for partition in metadata.topics[name].partitions
        ]
        consumer.assign(wanted)
        pending = {(tp.topic, tp.partition) for tp in wanted}
        deadline = Deadline(timeout_s)
        while pending and not deadline.passed():
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    pending.discard((msg.topic(), msg.partition()))
                continue
            yield msg
        assert not pending, f"partitions not read to their end in {deadline.describe()}: {pending}"
    finally:
        consumer.close()


def tier_topics(bootstrap: str, group: str, topic: str) -> list[str]:
    """The `topics` strategy's tier topics of `group` on `topic` (`<group>.<topic>.retry.*`)."""
    names = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics
    return sorted(n for n in names if n.startswith(f"{group}.{topic}.retry."))


def duplicates_of(requests: Iterable[Request]) -> Counter[str]:
    """The ids found more than once, and how many times each (read committed)."""
    counts = Counter(r.id for r in requests)
    return Counter({i: n for i, n in counts.items() if n > 1})


def extra(counts: Counter[str]) -> int:
    """How many records are repeats of an earlier one (a count of 3 is 2 extra)."""
    return sum(n - 1 for n in counts.values())


# ---------------------------------------------------------------------- report


@dataclass
class Tally:
    sent: int
    received: int
    lost: int
    duplicates: int
    missing: list[bytes]


def tally(sent: Iterable[bytes], received: Counter[bytes]) -> Tally:
    sent_set = set(sent)
    missing = sorted(sent_set - received.keys())
    duplicates = sum(count - 1 for value, count in received.items() if value in sent_set)
    total = sum(count for value, count in received.items() if value in sent_set)
    return Tally(len(sent_set), total, len(missing), duplicates, missing)


def report(
    case: str, result: Tally, faults: str, elapsed_s: float, counts: str | None = None
) -> None:
    """The test's one line; `counts` (optional) adds what else it counted after the
    duplicates (hand-offs, handler calls)."""
    more = f"; {counts}" if counts else ""
    print(
        f"\n[chaos {case}] mode={MODE.name} seed={SEED}: sent {result.sent}, "
        f"received {result.received}, lost {result.lost}, duplicates {result.duplicates}"
        f"{more}; {faults}; {elapsed_s:.0f}s",
        flush=True,
    )
    if result.missing:
        print(f"[chaos {case}] first missing: {result.missing[:10]}", flush=True)
