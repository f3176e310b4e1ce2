"""Real Spring Kafka applications' dead letters, ingested, shown, replayed and handled.

A Spring Kafka 4.1 application with ``@RetryableTopic`` (two attempts) and one with
``DefaultErrorHandler`` + ``DeadLetterPublishingRecoverer`` (tests/neighbours) each
dead-letter a record; the retry service ingests their dead-letter topics (format
auto). Each letter is in the API and the UI with its original topic, partition and
offset and the cause's class and message; replayed, the record arrives on its
original partition with its key, value and headers byte for byte and none of Spring's,
and the Spring application handles it as a new record: its main topic, then its retry
topic (or its own retries), before its dead-letter topic again.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.service_harness import replay_split
from tests.neighbours.build import build
from tests.neighbours.dead_letters import Letters, ingesting
from tests.neighbours.programs import Neighbour, neighbour
from tests.neighbours.records import Written, create_topic, read, unique, write

pytestmark = pytest.mark.integration

WAIT_S = 90.0
"""A quiet machine's seconds for a program to start, join its group and get as far."""
HEADERS = [("h1", b"x"), ("h1", b"y"), ("trace", b"\x00\xff")]
CAUSE = "java.lang.IllegalStateException"


@pytest.fixture(scope="session")
def built() -> Path:
    return build()


def _shown(letters: Letters, letter: dict[str, object], topic: str, failing: Written) -> None:
    """The letter as an operator finds it: where the record was first read, the cause."""
    assert letter["topic"] == topic
    assert letter["original"] == {
        "topic": topic,
        "partition": failing.partition,
        "offset": failing.offset,
        "timestamp": failing.timestamp,
    }
    assert letter["error_type"] == CAUSE  # not Spring's ListenerExecutionFailedException
    assert str(letter["error_message"]).endswith("refused fail one")
    # The record's own headers, none of Spring's.
    kept = [(h["name"], base64.b64decode(h["base64"])) for h in letter["headers"]]
    assert kept == HEADERS
    page = letters.page(int(str(letter["id"])))
    for shown in (topic, f"{failing.offset}", CAUSE, "refused fail one"):
        assert shown in page, shown


def _later(failing: Written) -> Callable[[dict[str, Any]], bool]:
    """A letter of the replayed record: read after the failing one, on its partition."""
    return lambda letter: int(letter["original"]["offset"]) > failing.offset


def _replayed(bootstrap: str, topic: str, failing: Written) -> None:
    """The replay on the failing record's partition, after it: key, value and headers
    byte for byte, none of Spring's."""
    records = read(bootstrap, topic, 3, timeout_s=WAIT_S)  # the two written, the replay
    [replay] = [r for r in records if r.offset() > failing.offset and r.value() == b"fail one"]
    assert replay.partition() == failing.partition
    assert replay.key() == b"k1"
    assert replay_split(replay.headers())[0] == HEADERS


def _handled_again(app: Neighbour, failing: Written) -> None:
    """The app reads the replay from its main topic, as a new record."""
    replayed = app.wait_for(
        "listener",
        where=lambda e: e["kind"] == "main" and e["offset"] > failing.offset,
        timeout_s=WAIT_S,
    )[0]
    names = [name for name, _ in replayed["headers"]]
    # A new record to Spring: no retry state; the replay's round, for the loop guard.
    assert names == [name for name, _ in HEADERS] + ["redrive-replays", "redrive-replay-of"]
    assert replayed["partition"] == failing.partition


def test_a_retryable_topic_letter_is_shown_replayed_and_retried_as_new(
    bootstrap: str, database_url: str, built: Path, tmp_path: Path
) -> None:
    topic = create_topic(bootstrap, unique("spring-rt"), partitions=2)
    dlt = create_topic(bootstrap, f"{topic}-dlt")  # as Spring would make it: 1 partition
    group = unique("spring-rt-group")
    [failing] = write(bootstrap, topic, [(b"k1", b"fail one", 1, HEADERS)])
    write(bootstrap, topic, [(b"k2", b"ok two", 0, [])])
    with (
        ingesting(bootstrap, database_url, [dlt], allowed=[topic]) as letters,
        neighbour("spring-retryable-topic", bootstrap, topic, group, log_dir=tmp_path) as app,
    ):
        app.wait_for("dlt_handler", timeout_s=WAIT_S)
        [letter] = letters.wait(1, ingested_from=dlt)
        assert letter["source"] == "ingest:spring-retry-topic"
        assert letter["group"] == group
        _shown(letters, letter, topic, failing)
        letters.replay(letter["id"])
        _replayed(bootstrap, topic, failing)
        _handled_again(app, failing)
        # Its retry topic sees it again (not its dead-letter topic at once), then the DLT.
        app.wait_for("dlt_handler", count=2, timeout_s=WAIT_S)
        kinds = [c["kind"] for c in app.events("listener") if c["value"] == "fail one"]
        assert kinds == ["main", "retry", "main", "retry"], kinds
        # A new letter: the replayed one is gone from the store (replays do not keep).
        again = letters.wait_for(_later(failing), ingested_from=dlt)
        assert again["original"]["partition"] == failing.partition


def test_a_recoverers_letter_is_shown_replayed_and_handled_as_new(
    bootstrap: str, database_url: str, built: Path, tmp_path: Path
) -> None:
    topic = create_topic(bootstrap, unique("spring-eh"), partitions=2)
    dlt = create_topic(bootstrap, f"{topic}-dlt", partitions=2)  # the recoverer's partition
    group = unique("spring-eh-group")
    [failing] = write(bootstrap, topic, [(b"k1", b"fail one", 1, HEADERS)])
    write(bootstrap, topic, [(b"k2", b"ok two", 0, [])])
    with (
        ingesting(bootstrap, database_url, [dlt], allowed=[topic]) as letters,
        neighbour("spring-error-handler", bootstrap, topic, group, log_dir=tmp_path) as app,
    ):
        [letter] = letters.wait(1, timeout_s=WAIT_S, ingested_from=dlt)
        assert letter["source"] == "ingest:spring"
        assert letter["group"] == group
        _shown(letters, letter, topic, failing)
        letters.replay(letter["id"])
        _replayed(bootstrap, topic, failing)
        _handled_again(app, failing)
        # Tried twice as a new record (FixedBackOff(0, 1)), then dead-lettered again.
        again = letters.wait_for(_later(failing), timeout_s=WAIT_S, ingested_from=dlt)
        kinds = [c["kind"] for c in app.events("listener") if c["value"] == "fail one"]
        assert kinds == ["main"] * 4, kinds
        assert again["original"]["partition"] == failing.partition
