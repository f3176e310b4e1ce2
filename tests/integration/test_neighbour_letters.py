"""Kafka Connect's, Kafka Streams' and a share group's dead letters, and a Java
producer's keyed records, through the retry service.

Real programs (tests/neighbours) write their dead-letter queues on the test broker:
a Kafka Connect 4.4 sink with ``errors.tolerance=all``, a Kafka Streams 4.4 application
with KIP-1034's dead-letter queue, and a share group of a Kafka 4.4 broker with
KIP-1191's (no copy of the record). The service ingests them (format auto): each
letter is in the API with its original topic, partition and offset, error and
record, and replayed it arrives on its original partition, byte for byte. Keyed
records a plain Java producer wrote, dead-lettered by a redrive App, name the
partitions it chose, and replayed to another topic land where the Java producer puts
the same keys there.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message

from redrive import App, FatalError
from redrive import Message as RedriveMessage
from tests.integration.consumer_harness import running_app
from tests.integration.service_harness import first_replay_of, replay_split
from tests.neighbours.build import build
from tests.neighbours.dead_letters import Letters, ingesting
from tests.neighbours.programs import neighbour
from tests.neighbours.records import Written, create_topic, read, unique, write

pytestmark = pytest.mark.integration

WAIT_S = 90.0
"""A quiet machine's seconds for a program to start, join its group and get as far."""
HEADERS = [("h1", b"x"), ("trace", b"\x00\xff")]


@pytest.fixture(scope="session")
def built() -> Path:
    return build()


def _kept(letter: dict[str, Any]) -> list[tuple[str, bytes | None]]:
    return [
        (h["name"], None if h["base64"] is None else base64.b64decode(h["base64"]))
        for h in letter["headers"]
    ]


def _located(letter: dict[str, Any], failing: Written) -> None:
    assert letter["topic"] == failing.topic
    assert letter["original"]["topic"] == failing.topic
    assert letter["original"]["partition"] == failing.partition
    assert letter["original"]["offset"] == failing.offset


def _replay_lands(
    bootstrap: str, letters: Letters, letter: dict[str, Any], failing: Written, total: int
) -> None:
    """Replayed, the record is on its original partition, after it, byte for byte.
    ``total``: the topic's records by then, the replay included."""
    letters.replay(letter["id"])
    records = read(bootstrap, failing.topic, total, timeout_s=WAIT_S)
    [replay] = [r for r in records if _is_replay_of(r, failing)]
    assert replay.key() == base64.b64decode(letter["key"]["base64"])
    assert replay.value() == base64.b64decode(letter["value"]["base64"])
    assert replay_split(replay.headers()) == (HEADERS, first_replay_of(letter["id"]))


def _is_replay_of(record: Message, failing: Written) -> bool:
    return record.partition() == failing.partition and (record.offset() or 0) > failing.offset


def test_a_kafka_connect_letter_is_ingested_and_replayed(
    bootstrap: str, database_url: str, built: Path, tmp_path: Path
) -> None:
    source = create_topic(bootstrap, unique("connect-in"), partitions=4)
    dlq = create_topic(bootstrap, unique("connect-dlq"), partitions=4)
    [failing] = write(bootstrap, source, [(b"k1", b"not json", 1, HEADERS)])
    write(bootstrap, source, [(b"k2", b'{"ok": 2}', 3, [])])
    with (
        ingesting(bootstrap, database_url, [dlq], allowed=[source]) as letters,
        neighbour("connect-sink", bootstrap, source, dlq, str(tmp_path / "w"), log_dir=tmp_path),
    ):
        [letter] = letters.wait(1, timeout_s=WAIT_S, ingested_from=dlq)
        assert letter["source"] == "ingest:connect"
        _located(letter, failing)
        assert letter["original"]["timestamp"] == failing.timestamp  # the record's own
        assert letter["error_type"] == "org.apache.kafka.connect.errors.DataException"
        assert "connector event-sink" in letter["reason"]
        assert _kept(letter) == HEADERS
        _replay_lands(bootstrap, letters, letter, failing, total=3)


def test_a_kafka_streams_letter_is_ingested_and_replayed(
    bootstrap: str, database_url: str, built: Path, tmp_path: Path
) -> None:
    source = create_topic(bootstrap, unique("streams-in"), partitions=4)
    output = create_topic(bootstrap, f"{source}-out")
    dlq = create_topic(bootstrap, f"{source}-dlq", partitions=4)
    [failing] = write(bootstrap, source, [(b"k1", b"fail one", 1, HEADERS)])
    write(bootstrap, source, [(b"k2", b"ok two", 3, [])])
    args = (source, output, unique("streams-app"), dlq, str(tmp_path / "state"))
    with (
        ingesting(bootstrap, database_url, [dlq], allowed=[source]) as letters,
        neighbour("streams-dlq", bootstrap, *args, log_dir=tmp_path),
    ):
        [letter] = letters.wait(1, timeout_s=WAIT_S, ingested_from=dlq)
        assert letter["source"] == "ingest:streams"
        _located(letter, failing)
        assert letter["original"]["timestamp"] == failing.timestamp
        assert letter["error_type"] == "java.lang.IllegalStateException"
        assert letter["error_message"] == "refused fail one"
        assert _kept(letter) == HEADERS
        _replay_lands(bootstrap, letters, letter, failing, total=3)


def test_a_share_groups_letter_gets_its_record_and_is_replayed(
    bootstrap: str, database_url: str, built: Path, tmp_path: Path
) -> None:
    source = create_topic(bootstrap, unique("share-in"), partitions=2)
    dlq = create_topic(
        bootstrap, unique("dlq.share"), config={"errors.deadletterqueue.group.enable": "true"}
    )
    group = unique("share-group")
    [failing] = write(bootstrap, source, [(b"k1", b"fail one", 1, HEADERS)])
    write(bootstrap, source, [(b"k2", b"ok two", 0, [])])
    with (
        ingesting(bootstrap, database_url, [dlq], allowed=[source]) as letters,
        neighbour("share-consumer", bootstrap, source, group, dlq, "false", log_dir=tmp_path) as c,
    ):
        [letter] = letters.wait(1, timeout_s=WAIT_S, ingested_from=dlq)
        assert letter["source"] == "ingest:share-group"
        assert letter["group"] == group
        _located(letter, failing)
        # The broker's letter names the record; its key, value, headers and time are
        # read from the topic, which still has it.
        assert base64.b64decode(letter["key"]["base64"]) == b"k1"
        assert base64.b64decode(letter["value"]["base64"]) == b"fail one"
        assert _kept(letter) == HEADERS
        assert letter["original"]["timestamp"] == failing.timestamp
        assert letter["error_message"] == "Offset rejected by client."
        assert letter["attempt"] == 1
        _replay_lands(bootstrap, letters, letter, failing, total=3)
        # The share group gets the replay as a new record (and rejects it again).
        c.wait_for(
            "delivered",
            where=lambda e: e["value"] == "fail one" and e["offset"] > failing.offset,
            timeout_s=WAIT_S,
        )


def test_a_java_producers_keys_are_placed_as_java_places_them(
    bootstrap: str, database_url: str, built: Path, tmp_path: Path
) -> None:
    """Keyed records from a Java producer, dead letters of a redrive App: each names the
    partition the Java producer chose; replayed to another topic (with more
    partitions) each lands where the Java producer puts its key there."""
    orders = create_topic(bootstrap, unique("java-orders"), partitions=3)
    elsewhere = create_topic(bootstrap, unique("java-elsewhere"), partitions=5)
    keys = ["order-1", "order-17", "b", "customer-42", "x" * 33, ""]
    pairs = [f"{key}=v{i}" for i, key in enumerate(keys)]
    placed: dict[str, dict[str, int]] = {}
    java_wrote: set[tuple[int, int]] = set()  # (partition, offset) of `elsewhere`
    for topic in (orders, elsewhere):
        with neighbour("keyed-producer", bootstrap, topic, *pairs, log_dir=tmp_path) as java:
            produced = java.wait_for("produced", count=len(keys), timeout_s=WAIT_S)
            assert java.wait_exit(timeout_s=WAIT_S) == 0
        placed[topic] = {p["key"]: p["partition"] for p in produced}
        java_wrote = {(p["partition"], p["offset"]) for p in produced}

    def refuse(message: RedriveMessage) -> None:
        raise FatalError("not today")

    with ingesting(bootstrap, database_url, [], allowed=[orders, elsewhere]) as letters:
        app = App(
            bootstrap,
            group=unique("java-app"),
            requests_topic=letters.service.settings.requests_topic,
        )
        app.add_handler(orders, refuse, strategy="service", dead_letters="service")
        with running_app(app):
            found = letters.wait(len(keys), timeout_s=WAIT_S, topic=orders)
        by_key = {base64.b64decode(f["key"]["base64"]).decode(): f for f in found}
        assert sorted(by_key) == sorted(keys)
        for key, letter in by_key.items():
            assert letter["original"]["partition"] == placed[orders][key]
            letters.replay(letter["id"], destination=elsewhere)
    landed = read(bootstrap, elsewhere, 2 * len(keys), timeout_s=WAIT_S)
    replays = [r for r in landed if (r.partition(), r.offset()) not in java_wrote]
    assert {(r.key() or b"").decode(): r.partition() for r in replays} == placed[elsewhere]
    # Not the partitions the records had: the placement is the key's, the Java way.
    assert placed[elsewhere] != placed[orders]
