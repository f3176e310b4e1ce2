"""No record stops an App, generated: batches of records with extreme or forged
contents (every redrive header forged, times at the ends of their range, thousands
of headers, names that are not UTF-8), written to one long-lived App of each
strategy, each end handled, retried or dead-lettered, key and value byte for byte,
and the App goes on.

Everything goes through the real broker (and the real retry service for strategy
`service`); records confluent-kafka's producer cannot write (a header name that is
not UTF-8) are written with kcat."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from redrive import App, Message, Topics, policy
from redrive.deadlines import Deadline
from redrive.headers import decode, is_redrive_header
from redrive.service.store.packed_headers import unpack_headers
from tests.integration.consumer_harness import retry_service, running_app
from tests.integration.kcat import kcat_produce
from tests.integration.service_harness import (
    Collector,
    dead_letters,
    now_ms,
)

pytestmark = pytest.mark.integration

STRATEGIES = ["blocking", "pause", "topics", "topics ordered", "service"]
"""The apps fed: one per strategy, and `topics` with ``ordering="key"`` (its key lines in
the tiers, with transactions)."""


# ------------------------------------------------------------------ hostile records, generated

TAG = "hostile-tag"
"""Added to every generated record: which record it is, whatever else it carries."""
OURS = b"@ours"
"""A generated header value replaced by the group of the app the record is written for."""
# One retry (two attempts); a deadline an hour after the record's time, so that forged
# and extreme times meet the deadline arithmetic.
POLICY = policy("100ms", max_duration="1h", deadline_from="record-timestamp")
FLAKY_EVERY = 3  # every third record fails its first handling

_FUTURE_OK = {"message.timestamp.after.max.ms": str(2**63 - 1)}
"""So that the broker takes any timestamp (by default, at most an hour ahead)."""

_FORGED: dict[str, list[bytes]] = {
    "redrive-destination": [b"orders", b"", b"..", b"\xff", b"x" * 300],
    "redrive-retry-at": [
        b"@now-1000000",
        b"@now+1500",
        b"@now+1000000000",
        b"9223372036854775807",
        b"99999999999999999999",
        b"-5",
        b"soon",
    ],
    "redrive-attempt": [b"-5", b"0", b"1", b"3", b"2147483647", b"2147483648", b"\xff\xfe"],
    "redrive-group": [OURS, OURS, b"someone-else", b"", b"\xff"],
    "redrive-deadline": [b"0", b"@now+1000000", b"9223372036854775807", b"x"],
    "redrive-original-timestamp": [b"9223372036854775807", b"0", b"-1"],
    "redrive-original-topic": [b"elsewhere", b"not a topic"],
    "redrive-original-offset": [b"9223372036854775807", b"-1", b"0", b"1"],
    "redrive-original-partition": [b"0", b"1", b"7", b"-1"],
    "redrive-order": [b"key", b"behind", b"release", b"sideways"],
    "redrive-partition": [b"2147483647", b"7"],
    "redrive-send-to": [b"dlq", b"nowhere"],
    "redrive-error-trace": [b"\xff" * 9000],
    "redrive-atempt": [b"1"],
    "Redrive-Attempt": [b"9"],  # the prefix is case-sensitive: one of the user's headers
}
_REAL_TIMESTAMPS = [1, -1, -5, -(2**63), 2**63 - 1]  # 0 means "now" to librdkafka


@dataclass(frozen=True)
class Hostile:
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[bytes, bytes | None], ...]
    timestamp: int | None  # None: the producer's clock
    kcat: bool  # written with kcat: some header names are not UTF-8


def _forged_header() -> st.SearchStrategy[tuple[bytes, bytes | None]]:
    return st.sampled_from(sorted(_FORGED)).flatmap(
        lambda name: st.tuples(
            st.just(name.encode()),
            st.one_of(st.sampled_from(_FORGED[name]), st.none(), st.binary(max_size=12)),
        )
    )


def _plausible_request() -> st.SearchStrategy[list[tuple[bytes, bytes | None]]]:
    """A destination and a retry-at that parse, so that the other forged values are read."""
    return st.tuples(
        st.just((b"redrive-destination", b"orders")),
        st.sampled_from([(b"redrive-retry-at", v) for v in _FORGED["redrive-retry-at"][:4]]),
    ).map(list)


def _cut(name: bytes) -> bytes:
    return name.split(b"\x00")[0]  # confluent-kafka reads names as C strings


_user_names = st.text(max_size=10).map(str.encode).filter(lambda n: _cut(n) != TAG.encode())
_values = st.one_of(st.none(), st.binary(max_size=40))


@st.composite
def _confluent_record(draw: st.DrawFn) -> Hostile:
    user = st.tuples(_user_names, _values)
    headers = draw(
        st.one_of(
            st.lists(st.one_of(user, _forged_header()), max_size=10),
            st.lists(user, min_size=100, max_size=300),
        )
    )
    if draw(st.booleans()):
        headers = draw(_plausible_request()) + headers
    timestamp = draw(
        st.one_of(
            st.none(), st.sampled_from(_REAL_TIMESTAMPS), st.integers(-(2**63), 2**63 - 1)
        ).filter(lambda t: t != 0)
    )
    key = draw(st.one_of(st.none(), st.just(b""), st.binary(max_size=20)))
    value = draw(st.one_of(st.none(), st.just(b""), st.binary(max_size=200)))
    return Hostile(key, value, tuple(headers), timestamp, kcat=False)


_kcat_bytes = st.binary(max_size=12).filter(lambda b: b"\x00" not in b)
_kcat_names = _kcat_bytes.filter(lambda n: n and b"=" not in n and n != TAG.encode())


@st.composite
def _kcat_record(draw: st.DrawFn) -> Hostile:
    value_of = st.one_of(st.none(), _kcat_bytes)
    headers = draw(st.lists(st.tuples(_kcat_names, value_of), max_size=8))
    bad = b"x-\xff" + draw(_kcat_names)  # at least one name that is not UTF-8
    headers.insert(draw(st.integers(0, len(headers))), (bad, draw(value_of)))
    key = draw(st.one_of(st.none(), _kcat_bytes))
    value = draw(st.binary(min_size=1, max_size=200))  # kcat skips an empty value
    return Hostile(key or None, value, tuple(headers), None, kcat=True)


batches = st.lists(
    st.one_of(_confluent_record(), _confluent_record(), _kcat_record()), min_size=1, max_size=12
)

_MANY = tuple((f"h{i}".encode(), b"\x00\xff" if i % 2 else b"") for i in range(10_000))
_MANY_FOR_KCAT = tuple((f"h{i}".encode(), b"\xff" if i % 2 else None) for i in range(9_999))
EXTREMES = [
    Hostile(None, None, _MANY, 2**63 - 1, kcat=False),
    Hostile(b"", b"", ((b"redrive-attempt", b"-5"), *_MANY[:50]), -5, kcat=False),
    Hostile(b"k", b"v", ((b"x-\xff\xfe", b"1"), *_MANY_FOR_KCAT), None, kcat=True),
    Hostile(
        None,
        b"forged",
        (
            (b"redrive-destination", b"orders"),
            (b"redrive-retry-at", b"9223372036854775807"),
            (b"redrive-attempt", b"2147483647"),
            (b"redrive-group", OURS),
            (b"redrive-original-timestamp", b"9223372036854775807"),
        ),
        1,
        kcat=False,
    ),
]

SHARED_ORIGIN = [
    Hostile(
        None,
        f"copy {i}".encode(),
        (
            (b"redrive-destination", b"orders"),
            (b"redrive-retry-at", b"@now+1500"),
            (b"redrive-original-topic", b"elsewhere"),
            (b"redrive-original-offset", b"0"),
        ),
        None,
        kcat=False,
    )
    for i in range(FLAKY_EVERY + 1)
]
"""Records that all claim to be the same original record (as a stream processor that
copies headers along makes them): the first and the last fail once, and each failure
is its own, not a repeat of the other."""


@dataclass
class Outcomes:
    """What became of each tagged record in one app: handled, or a dead letter."""

    handled: dict[bytes, tuple[bytes | None, bytes | None, list[Any]]] = field(default_factory=dict)
    dead: dict[bytes, tuple[bytes | None, bytes | None, list[Any], str]] = field(
        default_factory=dict
    )
    failed_once: set[bytes] = field(default_factory=set)
    untagged: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, message: Message) -> None:
        tag = message.header(TAG)
        with self.lock:
            if tag is None:
                self.untagged += 1
                return
            if int(tag.rsplit(b":", 1)[1]) % FLAKY_EVERY == 0 and tag not in self.failed_once:
                self.failed_once.add(tag)
                raise RuntimeError("fails once")
            self.handled[tag] = (message.key, message.raw_value, list(message.headers))

    def dead_letter(
        self, key: bytes | None, value: bytes | None, headers: list[Any], reason: str
    ) -> None:
        tag = dict(headers).get(TAG)
        with self.lock:
            if tag is None:
                self.untagged += 1
            else:
                self.dead[tag] = (key, value, headers, reason)

    def done(self) -> set[bytes]:
        with self.lock:
            return set(self.handled) | set(self.dead)


@dataclass
class Lane:
    """One long-lived app of one strategy, the topics it is fed, and what it did."""

    strategy: str
    app: App
    targets: list[str]
    outcomes: Outcomes
    collect: Callable[[], None]


@dataclass
class HostileEnv:
    bootstrap: str
    lanes: list[Lane]
    producer: Producer
    numbers: Iterator[int] = field(default_factory=itertools.count)


def _create_topics(bootstrap: str, names: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, num_partitions=2, config=_FUTURE_OK) for n in names])
    for future in futures.values():
        future.result(timeout=30)


def _dlq_collector(
    stack: ExitStack, bootstrap: str, topic: str, outcomes: Outcomes
) -> Callable[[], None]:
    collector = Collector(bootstrap, f"{topic}.dlq")
    stack.callback(collector.close)
    seen = [0]

    def collect() -> None:
        collector.poll_until(len(collector.received) + 100_000, 0.1)
        for letter in collector.received[seen[0] :]:
            request, users = decode(letter.headers)
            outcomes.dead_letter(letter.key, letter.value, users, request.reason or "")
        seen[0] = len(collector.received)

    return collect


def _store_collector(database: str, outcomes: Outcomes) -> Callable[[], None]:
    def collect() -> None:
        for row in dead_letters(database):
            key = None if row["msg_key"] is None else bytes(row["msg_key"])
            value = None if row["msg_value"] is None else bytes(row["msg_value"])
            users = [(n, v) for n, v in unpack_headers(row["headers"]) if not is_redrive_header(n)]
            outcomes.dead_letter(key, value, users, row["reason"] or "")

    return collect


@pytest.fixture(scope="module")
def hostile_env(bootstrap: str, database_url: str) -> Iterator[HostileEnv]:
    """One app per strategy, each on its own topic (2 partitions), started once: every
    generated batch goes to all of them. The `topics` app is also fed on its tier."""
    tag = uuid.uuid4().hex[:8]
    topics = {s: f"hostile-{s.replace(' ', '-')}-{tag}" for s in STRATEGIES}
    tiers = {  # the apps' groups, below
        s: f"hostile-{s.replace(' ', '-')}-{tag}.{topics[s]}.retry.100ms"
        for s in STRATEGIES
        if s.startswith("topics")
    }
    _create_topics(bootstrap, [*topics.values(), *tiers.values()])  # to take any time
    with ExitStack() as stack:
        service = stack.enter_context(
            retry_service(bootstrap, database_url, allowed_destinations=[topics["service"]])
        )
        lanes = []
        for strategy, topic in topics.items():
            outcomes = Outcomes()
            ordered = strategy.endswith(" ordered")
            app = App(
                bootstrap,
                group=f"hostile-{strategy.replace(' ', '-')}-{tag}",
                requests_topic=service.settings.requests_topic,
                transactional=ordered,
                commit_interval_s=0.2,
            )
            app.add_handler(
                topic,
                outcomes.handle,
                policy=POLICY,
                strategy=Topics(ordering="key") if ordered else strategy,  # type: ignore[arg-type]
            )
            stack.enter_context(running_app(app))
            if strategy == "service":
                collect = _store_collector(service.database_url, outcomes)
            else:
                collect = _dlq_collector(stack, bootstrap, topic, outcomes)
            targets = [topic, tiers[strategy]] if strategy in tiers else [topic]
            lanes.append(Lane(strategy, app, targets, outcomes, collect))
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        stack.callback(producer.flush, 30)
        yield HostileEnv(bootstrap, lanes, producer)


def _materialize(raw: bytes | None, group: str, now: int) -> bytes | None:
    if raw == OURS:
        return group.encode()
    if raw is not None and raw.startswith(b"@now"):
        return str(now + int(raw[4:])).encode()
    return raw


def _write(env: HostileEnv, lane: Lane, topic: str, record: Hostile, tag: bytes) -> None:
    group = lane.app.group
    headers = [(n, _materialize(v, group, now_ms())) for n, v in record.headers]
    headers.insert(0, (TAG.encode(), tag))
    if record.kcat:
        kcat_produce(env.bootstrap, topic, record.key, record.value or b"", headers)
        return
    kwargs: dict[str, Any] = {
        "key": record.key,
        "value": record.value,
        "headers": [(n.decode(), v) for n, v in headers],
    }
    if record.timestamp is not None:
        kwargs["timestamp"] = record.timestamp
    while True:
        try:
            env.producer.produce(topic, **kwargs)
            return
        except BufferError:
            env.producer.poll(0.05)


def _expected_headers(record: Hostile, tag: bytes) -> list[tuple[str, bytes | None]]:
    """The user's headers a handler sees: names cut at NUL, redrive-* ones read apart."""
    named = [(_cut(n).decode(), v) for n, v in record.headers]
    return [(TAG, tag), *((n, v) for n, v in named if not is_redrive_header(n))]


def _check(lane: Lane, sent: dict[bytes, Hostile]) -> None:
    """Key and value byte for byte, whichever way a record went; the headers a handler
    saw; and the reason of a record whose headers could not be read."""
    out = lane.outcomes
    for tag, record in sent.items():
        where = f"{lane.strategy}, {tag!r}"
        if tag in out.handled:
            key, value, headers = out.handled[tag]
            assert not record.kcat, f"{where}: unreadable headers reached the handler"
            assert headers == _expected_headers(record, tag), f"{where}: headers"
        else:
            key, value, _, reason = out.dead[tag]
            if record.kcat:
                assert "not valid UTF-8" in reason, f"{where}: {reason}"
        assert key == record.key and value == record.value, where


@settings(
    max_examples=12,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # a shrink would take long
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@example(batch=EXTREMES)
@example(batch=SHARED_ORIGIN)
@given(batch=batches)
def test_hostile_records_end_handled_retried_or_dead_lettered(
    hostile_env: HostileEnv, batch: list[Hostile]
) -> None:
    env = hostile_env
    number = next(env.numbers)
    sent: dict[str, dict[bytes, Hostile]] = {lane.strategy: {} for lane in env.lanes}
    for lane in env.lanes:
        for target in lane.targets:
            for i, record in enumerate(batch):
                tag = f"{number}-{target}:{i}".encode()
                _write(env, lane, target, record, tag)
                sent[lane.strategy][tag] = record
    assert env.producer.flush(30) == 0

    def all_done() -> bool:
        for lane in env.lanes:
            lane.collect()
        return all(set(sent[lane.strategy]) <= lane.outcomes.done() for lane in env.lanes)

    deadline = Deadline(120)
    while not all_done() and not deadline.passed():
        time.sleep(0.05)
    for lane in env.lanes:
        tags = sent[lane.strategy]
        assert lane.app.running.is_set(), f"the {lane.strategy} app stopped"
        lost = {t: tags[t] for t in set(tags) - lane.outcomes.done()}
        assert not lost, f"{lane.strategy}: neither handled nor dead-lettered: {lost}"
        assert lane.outcomes.untagged == 0
        _check(lane, tags)
