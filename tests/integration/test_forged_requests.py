"""What an attacker who can write the requests topic, but holds no key, can do to the
requests of a signing App, on the real broker and service.

The service is configured as docs/signing.md says: a key file with a new and an old
key, signatures required. Genuine requests are made the way a signing App writes
them: ``redrive-id`` sealed with the App's key (``KeyRing.sealed_id``), signed over
the request (``KeyRing.signed``). In every order of arrival the genuine request is
delivered (or stored) exactly once, and the forgery is refused: a dead letter of its
own (``invalid_signature``), counted in ``redrive_requests_invalid_total``. Without
required signatures, an unsigned copy of a signed request under its id is refused as
a forgery too: it is not the request that was accepted.
"""

from __future__ import annotations

import base64
import dataclasses
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from redrive import KeyRing
from redrive.headers import (
    ATTEMPT,
    DEADLINE,
    DESTINATION,
    ERROR_MESSAGE,
    GROUP,
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TOPIC,
    PARTITION,
    RETRY_AT,
    RUN,
    SEND_TO,
    SIGNATURE,
    Header,
    RetryHeaders,
    encode,
    failure_request_id,
    read_delivery_headers,
    request_id,
)
from redrive.kafka import consume_available
from redrive.returns import ReturnCheck
from redrive.service.config import ServiceSettings
from redrive.service.service import RetryService
from tests.integration.service_harness import (
    dead_letters,
    fresh_database,
    now_ms,
    produce,
    running_service,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.integration


def _key(key_id: str, seed: int) -> str:
    return f"{key_id}={base64.b64encode(bytes([seed]) * 32).decode()}"


NEW, OLD = _key("k2026b", 2), _key("k2026a", 1)
APP = KeyRing.from_settings([NEW])
"""The senders' ring: the new key, as the docs' rotation has them after step 2."""
READER = ReturnCheck(KeyRing.from_settings([NEW, OLD]))
"""What a reader holding the keys asks of a delivery before it believes it."""
SOURCE = "payments"
HOUR = 3_600_000


@dataclass
class Service:
    """A running service and what a test reads of it."""

    settings: ServiceSettings
    service: RetryService
    database: str
    bootstrap: str

    def send(self, *records: dict[str, Any]) -> None:
        """Produce to the requests topic, in order (one key's records stay in order)."""
        produce(self.bootstrap, self.settings.requests_topic, list(records))

    def refused(self) -> float:
        """``redrive_requests_invalid_total{reason="invalid_signature"}`` so far."""
        found = self.service.metrics.registry.get_sample_value(
            "redrive_requests_invalid_total", {"reason": "invalid_signature"}
        )
        return found or 0.0

    def repeats(self, stage: str) -> float:
        found = self.service.metrics.registry.get_sample_value(
            "redrive_requests_repeated_total", {"stage": stage}
        )
        return found or 0.0

    def letters(self, group: str) -> list[dict[str, Any]]:
        """The dead letters of a test's group (its forgeries, which may name another
        group, name one that starts with it)."""
        return [d for d in dead_letters(self.database) if (d["group_id"] or "").startswith(group)]


@contextmanager
def _started(
    bootstrap: str, database_url: str, key_dir: Path, *, required: bool
) -> Iterator[Service]:
    keys = key_dir / "signing-keys"
    keys.write_text(f"# the retry service's keys: the new one first\n{NEW}\n{OLD}\n")
    database = fresh_database(database_url)
    settings = settings_for(
        bootstrap,
        database,
        allowed_destinations=["forged-*"],
        require_signatures=required,
        signing_key_files=[str(keys)],
    )
    with running_service(settings) as service:
        yield Service(settings, service, database, bootstrap)


@pytest.fixture(scope="module")
def signed(
    bootstrap: str, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    """A service requiring signatures, shared by the module's tests (each test's own
    group and topics tell its records apart)."""
    with _started(bootstrap, database_url, tmp_path_factory.mktemp("keys"), required=True) as env:
        yield env


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def _retry(topic: str, group: str, offset: int, **fields: Any) -> RetryHeaders:
    """A signing App's request for the first failure of record ``offset`` of
    ``payments`` in ``group`` (``fields`` changing it), its id sealed."""
    plain = failure_request_id(group, 1, (SOURCE, 0, offset), None)
    return RetryHeaders(
        **{
            "destination": topic,
            "retry_at": now_ms(),
            "attempt": 1,
            "group": group,
            "original_topic": SOURCE,
            "original_partition": 0,
            "original_offset": offset,
            "error_type": "TimeoutError",
            "error_message": f"the bank timed out on p-{offset}",
            "id": APP.sealed_id(plain),
            **fields,
        }
    )


def _signed(request: RetryHeaders, key: bytes | None, value: bytes | None) -> dict[str, Any]:
    """The record a signing App writes for ``request``."""
    return {"key": key, "value": value, "headers": APP.signed(encode(request), key, value)}


def _unsigned(request: RetryHeaders, key: bytes | None, value: bytes | None) -> dict[str, Any]:
    """The record an attacker without a key writes: the same headers, no signature."""
    return {"key": key, "value": value, "headers": encode(request)}


def _plain(request: RetryHeaders) -> RetryHeaders:
    """``request`` under the id an attacker can compute: the plain one, not sealed."""
    assert request.group is not None and request.original_offset is not None
    failed = (SOURCE, 0, request.original_offset)
    return dataclasses.replace(request, id=failure_request_id(request.group, 1, failed, None))


@dataclass
class Read:
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    partition: int


def read_to_end(bootstrap: str, topic: str) -> list[Read]:
    """Every record of ``topic``, each partition read up to its end."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "enable.auto.commit": False}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in partitions
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        found: list[Read] = []
        while len(found) < sum(ends.values()):
            found += [
                Read(m.key(), m.value(), list(m.headers() or []), m.partition())
                for m in consume_available(consumer, 500, 0.5)
                if m.error() is None
            ]
        return found
    finally:
        consumer.close()


def believed(topic: str, record: Read) -> bool:
    """Whether a reader holding the keys believes the delivery's redrive headers."""
    delivery = read_delivery_headers(record.headers)
    assert delivery is not None, "a delivery without its redrive headers"
    return (
        READER.doubt(
            record.headers, record.key, record.value, delivery, (topic, record.partition), topic
        )
        is None
    )


def _waiting(database: str) -> int:
    """Pending rows not delivered yet (a key queue's delivered rows wait for their
    release, out with their consumer)."""
    with psycopg.connect(database) as conn:
        row = conn.execute(
            "SELECT count(*) FROM redrive_pending WHERE delivered_ms IS NULL"
        ).fetchone()
    return int(row[0]) if row else 0


def _outcome(
    env: Service,
    group: str,
    refused_before: float,
    *,
    forgeries: int,
    letters: int,
    topic: str,
    delivered: int,
) -> tuple[list[Read], list[dict[str, Any]]]:
    """Once each forgery is counted, the group has ``letters`` dead letters, ``topic``
    at least ``delivered`` records and nothing waits to be delivered: the topic's
    records, read to its end, and the group's letters."""
    wait_until(
        lambda: env.refused() - refused_before == forgeries, 60, f"{forgeries} forgeries counted"
    )
    wait_until(lambda: len(env.letters(group)) == letters, 30, f"{letters} dead letters")
    wait_until(
        lambda: len(read_to_end(env.bootstrap, topic)) >= delivered, 60, f"{delivered} delivered"
    )
    wait_until(lambda: _waiting(env.database) == 0, 60, "nothing waiting to be delivered")
    records = read_to_end(env.bootstrap, topic)
    assert len(records) == delivered, [r.value for r in records]
    assert env.refused() - refused_before == forgeries
    found = env.letters(group)
    invalid = [d for d in found if d["reason_code"] == "invalid_signature"]
    assert len(invalid) == forgeries, [d["reason"] for d in found]
    assert all(d["reason"].startswith("invalid signature: ") for d in invalid)
    return records, found


def test_a_retry_forged_under_its_id_before_or_after_it_takes_nothing_from_it(
    signed: Service, new_topic: Callable[..., str]
) -> None:
    """Sent ahead of a genuine retry with the id anyone can compute from its failure,
    or (the worst case) with its sealed id itself, or copied after it with another
    value: each forgery is refused and counted, each genuine retry delivered once."""
    topic, group = new_topic("forged"), _group()
    before = signed.refused()
    ahead_plain, ahead_sealed, after = (_retry(topic, group, n) for n in (1, 2, 3))
    signed.send(
        _unsigned(_plain(ahead_plain), b"p-1", b"forged 1"),
        _signed(ahead_plain, b"p-1", b"genuine 1"),
        _unsigned(ahead_sealed, b"p-2", b"forged 2"),
        _signed(ahead_sealed, b"p-2", b"genuine 2"),
        _signed(after, b"p-3", b"genuine 3"),
        _unsigned(after, b"p-3", b"forged 3"),
        # Its signed headers, another value: the signature no longer matches.
        {**_signed(after, b"p-3", b"genuine 3"), "value": b"forged 3b"},
    )
    records, letters = _outcome(
        signed, group, before, forgeries=4, letters=4, topic=topic, delivered=3
    )
    assert sorted(r.value for r in records) == [b"genuine 1", b"genuine 2", b"genuine 3"]
    assert all(believed(topic, r) for r in records), "deliveries carry their signature"
    assert sorted(bytes(d["msg_value"]) for d in letters) == [
        b"forged 1",
        b"forged 2",
        b"forged 3",
        b"forged 3b",
    ]


def test_a_dead_letter_forged_under_its_id_before_or_after_it_takes_nothing_from_it(
    signed: Service, new_topic: Callable[..., str]
) -> None:
    """A signing App's dead letters (``redrive-send-to: dlq``) each stored once, under
    forgeries sent ahead (plain and sealed id) and after: nothing delivered."""
    topic, group = new_topic("forged"), _group()
    before = signed.refused()
    given_up = {"send_to": "dlq", "reason": "spent", "reason_code": "attempts_exhausted"}
    ahead_plain, ahead_sealed, after = (_retry(topic, group, n, **given_up) for n in (4, 5, 6))
    signed.send(
        _unsigned(_plain(ahead_plain), b"p-4", b"forged 4"),
        _signed(ahead_plain, b"p-4", b"genuine 4"),
        _unsigned(ahead_sealed, b"p-5", b"forged 5"),
        _signed(ahead_sealed, b"p-5", b"genuine 5"),
        _signed(after, b"p-6", b"genuine 6"),
        _unsigned(after, b"p-6", b"forged 6"),
    )
    _, letters = _outcome(signed, group, before, forgeries=3, letters=6, topic=topic, delivered=0)
    by_reason = {
        code: sorted(bytes(d["msg_value"]) for d in letters if d["reason_code"] == code)
        for code in ("attempts_exhausted", "invalid_signature")
    }
    assert by_reason == {
        "attempts_exhausted": [b"genuine 4", b"genuine 5", b"genuine 6"],
        "invalid_signature": [b"forged 4", b"forged 5", b"forged 6"],
    }


def test_a_key_order_release_forged_under_its_id_before_or_after_it_takes_nothing_from_it(
    signed: Service, new_topic: Callable[..., str]
) -> None:
    """Two keys' heads out with their consumer, a record waiting behind each: a forged
    release sent ahead of the genuine one (plain and sealed id) and one after it are
    refused and counted; each genuine release lets its record behind go, once, and the
    runs (marked ``redrive-run`` by the service) are signed again, so they verify."""
    topic, group = new_topic("forged"), _group()
    before = signed.refused()
    heads = {key: _retry(topic, group, n, order="key") for key, n in ((b"k1", 10), (b"k2", 20))}
    signed.send(*(_signed(head, key, b"head " + key) for key, head in heads.items()))
    wait_until(lambda: len(read_to_end(signed.bootstrap, topic)) == 2, 60, "both heads out")

    def behind(key: bytes, offset: int) -> dict[str, Any]:
        fields = {"attempt": 0, "order": "behind", "error_type": None, "error_message": None}
        request = _retry(topic, group, offset, **fields)
        plain = request_id(dataclasses.replace(request, id=None))
        return _signed(dataclasses.replace(request, id=APP.sealed_id(plain)), key, b"behind " + key)

    def release(key: bytes) -> tuple[RetryHeaders, RetryHeaders]:
        """The genuine release of ``key``'s head, and the same under its plain id."""
        head = heads[key]
        plain = RetryHeaders(
            destination=topic,
            retry_at=now_ms(),
            attempt=head.attempt,
            group=group,
            original_topic=SOURCE,
            original_partition=0,
            original_offset=head.original_offset,
            order="release",
        )
        plain = dataclasses.replace(plain, id=request_id(plain))
        return dataclasses.replace(plain, id=APP.sealed_id(plain.id or "")), plain

    first, first_plain = release(b"k1")
    second, _ = release(b"k2")
    signed.send(
        behind(b"k1", 11),
        _unsigned(first_plain, b"k1", None),
        _unsigned(first, b"k1", None),
        _signed(first, b"k1", None),
        behind(b"k2", 21),
        _signed(second, b"k2", None),
        _unsigned(second, b"k2", None),
    )
    records, _ = _outcome(signed, group, before, forgeries=3, letters=3, topic=topic, delivered=4)
    assert sorted(r.value for r in records) == [b"behind k1", b"behind k2", b"head k1", b"head k2"]
    assert all(dict(r.headers).get(RUN) for r in records), "each went in a run"
    assert all(believed(topic, r) for r in records), "runs signed again by the service"


def _altered_copies(
    genuine: dict[str, Any], group: str, other: str, *, signature: bool
) -> list[dict[str, Any]]:
    """Copies of ``genuine`` under its id with one covered field each changed: each
    redrive header it is asked by (``other``, another allowed topic, as the
    destination; a group that still starts with ``group``), its key, its value. With
    ``signature``, each keeps the genuine one; else none has any."""
    headers = [h for h in genuine["headers"] if signature or h[0] != SIGNATURE]
    changes = {
        DESTINATION: other.encode(),
        PARTITION: b"1",
        RETRY_AT: str(now_ms() + 1_000).encode(),
        ATTEMPT: b"3",
        DEADLINE: str(now_ms() + HOUR + 1).encode(),
        GROUP: f"{group}-other".encode(),
        ORIGINAL_TOPIC: b"refunds",
        ORIGINAL_PARTITION: b"1",
        ORIGINAL_OFFSET: b"999",
        ERROR_MESSAGE: b"another error",
        SEND_TO: b"dlq",
    }
    copies = [
        {**genuine, "headers": [*((n, v) for n, v in headers if n != name), (name, value)]}
        for name, value in changes.items()
    ]
    copies.append({**genuine, "headers": headers, "key": b"another key"})
    copies.append({**genuine, "headers": headers, "value": b"another value"})
    return copies


def test_an_accepted_request_copied_with_any_covered_field_changed_is_a_forgery(
    signed: Service, new_topic: Callable[..., str]
) -> None:
    """After a signed retry is accepted, copies of it under its id with its
    destination, partition, due time, attempt, deadline, group, original coordinates,
    error, send-to, key or value changed: each refused and counted, nothing of them
    delivered; an exact copy is a repeat; the retry delivered once."""
    topic, other, group = new_topic("forged", 2), new_topic("forged", 2), _group()
    before, repeated = signed.refused(), signed.repeats("retry")
    genuine = _signed(_retry(topic, group, 30, deadline=now_ms() + HOUR), b"p-30", b"genuine")
    copies = _altered_copies(genuine, group, other, signature=True)
    assert len(copies) == 13
    signed.send(genuine, *copies, genuine)
    # At least one: intake reading a batch again (a rebalance under load) counts its
    # requests as repeats too; what must hold is that nothing more is delivered.
    wait_until(lambda: signed.repeats("retry") - repeated >= 1, 60, "the exact copy a repeat")
    records, _ = _outcome(signed, group, before, forgeries=13, letters=13, topic=topic, delivered=1)
    assert [r.value for r in records] == [b"genuine"] and believed(topic, records[0])
    assert read_to_end(signed.bootstrap, other) == []


def test_an_unsigned_copy_of_a_signed_request_is_a_forgery_when_signatures_are_not_required(
    bootstrap: str, database_url: str, tmp_path: Path, new_topic: Callable[..., str]
) -> None:
    """With keys but signatures not required, unsigned requests are accepted: but not
    under the id of a signed one accepted before. An unsigned copy of it (same id, key
    and value), and unsigned copies with any covered field changed, are refused and
    counted as forgeries by what they carry; a signed copy is a repeat."""
    topic, other, group = new_topic("forged", 2), new_topic("forged", 2), _group()
    with _started(bootstrap, database_url, tmp_path, required=False) as env:
        genuine = _signed(_retry(topic, group, 40, deadline=now_ms() + HOUR), b"p-40", b"genuine")
        exact = {**genuine, "headers": [h for h in genuine["headers"] if h[0] != SIGNATURE]}
        copies = [exact, *_altered_copies(genuine, group, other, signature=False)]
        # The genuine request first (read first: one key, one partition), its copies
        # after; ``another key`` goes elsewhere, so it waits for the genuine one.
        env.send(genuine)
        wait_until(lambda: len(read_to_end(bootstrap, topic)) == 1, 60, "the genuine delivered")
        env.send(*copies, genuine)
        wait_until(lambda: env.repeats("retry") >= 1, 60, "the signed copy a repeat")
        records, letters = _outcome(
            env, group, 0, forgeries=14, letters=14, topic=topic, delivered=1
        )
        assert [r.value for r in records] == [b"genuine"] and believed(topic, records[0])
        assert read_to_end(bootstrap, other) == []
        for letter in letters:
            assert (
                "a different request under the redrive-id of one accepted before"
                in (letter["reason"])
            )
