"""A retry service requiring signatures delivers only what a holder of its keys signed.

Forged requests (none, a wrong signature, a valid signature over changed headers, a
signed request replayed with another value, a key it does not list) each become a dead
letter with reason ``invalid_signature``, and the destination topic, read to its end,
holds nothing of them; requests signed by a real App with the docs' example, and one
signed with the previous key still listed (a rotation), are delivered, each with its
request's signature, which a reader holding the keys verifies.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Message, TopicPartition

from redrive import App, KeyRing
from redrive.headers import SIGNATURE, read_delivery_headers
from redrive.kafka import consume_available
from redrive.returns import ReturnCheck
from tests.integration.consumer_harness import outcome_count, running_example, wait_for
from tests.integration.service_harness import (
    dead_letters,
    fresh_database,
    now_ms,
    produce,
    request_headers,
    running_service,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.integration

SIGNING_DOC = Path(__file__).resolve().parents[2] / "docs" / "signing.md"


def key(key_id: str, seed: int) -> str:
    return f"{key_id}={base64.b64encode(bytes([seed]) * 32).decode()}"


NEW, OLD, OTHER = key("k2026b", 2), key("k2026a", 1), key("k-unknown", 9)
OLD_PAYMENT = json.dumps({"id": "p-old"}).encode()
"""A retry (attempt 2) signed with the previous key, still listed."""


def signing_example(replacements: dict[str, str]) -> str:
    """The python block of "## Signing an App" in docs/signing.md, pointed at the test's
    broker, topics and key file."""
    section = SIGNING_DOC.read_text().split("\n## Signing an App\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    for old, new in replacements.items():
        assert block.count(old) == 1, f"the docs example no longer says {old}"
        block = block.replace(old, new)
    return block


def read_to_end(bootstrap: str, topic: str) -> list[Message]:
    """Every record of ``topic`` (one partition), up to its end."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "enable.auto.commit": False}
    )
    _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.assign([TopicPartition(topic, 0, 0)])
    records: list[Message] = []
    while len(records) < high:
        records += [m for m in consume_available(consumer, 500, 0.5) if m.error() is None]
    consumer.close()
    return records


def believed(topic: str, record: Message) -> bool:
    """Whether a reader holding the service's keys believes a delivery's redrive
    headers: it carries its request's signature, which names where it went."""
    headers = list(record.headers() or [])
    delivery = read_delivery_headers(headers)
    assert delivery is not None
    read_on = (topic, record.partition() or 0)
    check = ReturnCheck(KeyRing.from_settings([NEW, OLD]))
    return check.doubt(headers, record.key(), record.value(), delivery, read_on, topic) is None


def test_forged_requests_are_dead_letters_and_signed_ones_are_delivered(
    bootstrap: str, database_url: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic("signed")
    db = fresh_database(database_url)
    settings = settings_for(
        bootstrap,
        db,
        allowed_destinations=[topic],
        require_signatures=True,
        signing_keys=[NEW, OLD],  # rotating: the new key first, the old still listed
    )
    requests = settings.requests_topic
    new, old = KeyRing.from_settings([NEW]), KeyRing.from_settings([OLD])
    group = f"g-{uuid.uuid4().hex[:8]}"
    headers = request_headers(topic, now_ms(), attempt=1, group=group)
    signed = new.signed(headers, b"forged-replayed", b"the signed value")
    changed = [
        (n, b"9" if n == "redrive-attempt" else v)
        for n, v in new.signed(headers, b"forged-changed", b"v")
    ]
    forged = {
        b"forged-unsigned": headers,
        b"forged-wrong": [*headers, (SIGNATURE, b"v1:k2026b:" + b"A" * 43)],
        b"forged-changed": changed,  # a valid signature, then another attempt count
        b"forged-replayed": signed,  # a signed request's headers, another value
        b"forged-unknown-key": KeyRing.from_settings([OTHER]).signed(
            headers, b"forged-unknown-key", b"v"
        ),
    }
    keys_file = tmp_path / "signing-keys"
    # Rolled to the new key; the old one stays after it (step 2 of a rotation): the App
    # reads back deliveries of requests signed with it, which carry their signature.
    keys_file.write_text(f"# the senders' keys\n{NEW}\n{OLD}\n")
    source = signing_example(
        {
            '"localhost:9092"': repr(bootstrap),
            '"billing"': repr(group),
            '"redrive.requests"': repr(requests),
            '"payments"': repr(topic),
            '"/etc/redrive/signing-keys"': repr(str(keys_file)),
        }
    )
    with running_service(settings) as service:
        produce(
            bootstrap,
            requests,
            [
                *(
                    {
                        "key": k,
                        "value": b"forged value" if k == b"forged-replayed" else b"v",
                        "headers": h,
                    }
                    for k, h in forged.items()
                ),
                {
                    "key": b"old-key",
                    "value": OLD_PAYMENT,
                    "headers": old.signed(headers, b"old-key", OLD_PAYMENT),
                },
            ],
        )
        with running_example(source) as example:
            app: App = example["app"]
            payments = [{"id": f"p-{i}"} for i in range(3)]
            produce(
                bootstrap,
                topic,
                [{"key": p["id"].encode(), "value": json.dumps(p).encode()} for p in payments],
            )
            # Each payment fails once, is retried through the service, and succeeds; the
            # old key's request is delivered to the topic and handled too.
            assert wait_for(lambda: outcome_count(app, topic, "handled") == 4, 60)
            assert outcome_count(app, topic, "retried") == 3
        wait_until(lambda: len(dead_letters(db)) == len(forged), 30, "every forged request stored")
        refused = service.metrics.registry.get_sample_value(
            "redrive_requests_invalid_total", {"reason": "invalid_signature"}
        )
    letters = dead_letters(db)
    assert sorted(bytes(d["msg_key"]) for d in letters) == sorted(forged)
    assert {d["reason_code"] for d in letters} == {"invalid_signature"}
    reasons = {bytes(d["msg_key"]): d["reason"] for d in letters}
    assert reasons[b"forged-unsigned"] == "invalid signature: the request is not signed"
    assert "not one of ours" in reasons[b"forged-unknown-key"]
    assert "does not match" in reasons[b"forged-replayed"]
    assert refused == len(forged)
    records = read_to_end(bootstrap, topic)
    delivered = [r.key() for r in records]
    assert not [k for k in delivered if k is not None and k.startswith(b"forged")]
    assert sorted(delivered) == sorted([b"p-0", b"p-1", b"p-2"] * 2 + [b"old-key"])
    # The service's deliveries (the records with redrive headers) keep their signature.
    retries = [r for r in records if read_delivery_headers(r.headers()) is not None]
    assert len(retries) == 4 and all(believed(topic, r) for r in retries)
