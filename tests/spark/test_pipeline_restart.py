"""A Spark pipeline stopped with Ctrl-C while a batch's tasks run, then started again
from its checkpoint: the batch runs again. Every record ends handled or dead-lettered,
no retry is delivered twice and no dead letter is stored twice:

- with exactly-once delivery (the default), the re-run writes nothing the first run
  committed: a ``read_committed`` reader sees each result and each request once;
- at least once, it writes its retry requests and dead letters again, and the retry
  service, their receiver, keeps one of each.

The handler (tests/spark/pipeline_handlers.py:handle_slowly) notes each call in a
file, which is how the test sees the batch half done.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from redrive.deadlines import Deadline
from redrive.headers import ID
from redrive.service.service import RetryService
from tests.integration.service_harness import (
    dead_letters,
    fresh_database,
    produce,
    running_service,
    settings_for,
)
from tests.spark import TopicReader
from tests.spark.pipeline_handlers import CALLS_FILE
from tests.spark.test_pipeline_command import (
    HANDLERS,
    REPO,
    child_env,
    redrive_spark_pipeline,
    tail,
)

pytestmark = pytest.mark.spark

PARTITIONS = 4  # one task each, two at a time on two cores
PER_PARTITION = 48
KINDS = ("retry", "dead", "fine")


def records() -> list[dict[str, object]]:
    return [
        {"partition": p, "key": value, "value": value}
        for p in range(PARTITIONS)
        for i in range(PER_PARTITION)
        for value in [f"{KINDS[i % 3]}-{p}-{i}".encode()]
    ]


class Pipeline:
    """`redrive spark pipeline` in a session of its own, so that Ctrl-C (SIGINT to the
    process group) reaches the driver and its JVM, as from a terminal."""

    def __init__(self, options: list[str], calls: Path, log: Path) -> None:
        self.command = redrive_spark_pipeline(f"{HANDLERS}:handle_slowly", *options)
        self.env = child_env(**{CALLS_FILE: str(calls)})
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                self.command,
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def check_running(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            pytest.fail(f"the pipeline exited ({self.process.returncode}):\n{tail(self.log)}")

    def interrupt(self) -> int:
        """Ctrl-C, and wait for it to end."""
        assert self.process is not None
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
        try:
            return self.process.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait(30)


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Callable[[list[str]], Pipeline]]:
    started: list[Pipeline] = []

    def make(options: list[str]) -> Pipeline:
        made = Pipeline(options, tmp_path / "calls.txt", tmp_path / "pipeline.log")
        started.append(made)
        return made

    yield make
    for made in started:
        made.interrupt()


def calls_of(calls: Path) -> list[tuple[str, int]]:
    if not calls.exists():
        return []
    lines = calls.read_text().splitlines()
    return [(value, int(attempt)) for value, attempt in (line.split() for line in lines)]


def repeats(service: RetryService) -> float:
    return sum(
        service.exposed_metrics.get_sample_value("redrive_requests_repeated_total", {"stage": s})
        or 0.0
        for s in ("retry", "dead_letter")
    )


def received(service: RetryService) -> float:
    value = service.exposed_metrics.get_sample_value("redrive_requests_received_total")
    return value or 0.0


@pytest.mark.parametrize("delivery", ["exactly-once", "at-least-once"])
def test_a_pipeline_stopped_mid_batch_and_restarted_repeats_no_hand_off(
    delivery: str,
    bootstrap: str,
    database_url: str,
    new_topic: Callable[..., str],
    tmp_path: Path,
    pipeline: Callable[[list[str]], Pipeline],
) -> None:
    source = new_topic("restart-orders", partitions=PARTITIONS)
    output = new_topic("restart-out")
    db = fresh_database(database_url)
    settings = settings_for(bootstrap, db, allowed_destinations=[source])
    options = [
        *("--source", source, "--output", output),
        *("--requests-topic", settings.requests_topic, "--group", "billing"),
        *("--policy", "1s x3", "--checkpoint", str(tmp_path / "ckpt")),
        *("--retry-on", f"{HANDLERS}.Declined", "--fatal-on", "ValueError"),
        *("--trigger", "500 milliseconds", "--bootstrap", bootstrap),
        *("--delivery", delivery),
    ]
    produce(bootstrap, source, records())
    sent = {r["value"] for r in records()}
    calls = tmp_path / "calls.txt"
    with running_service(settings) as service:  # which makes the requests topic
        reader = TopicReader(bootstrap, [source, output, settings.requests_topic])
        try:
            first = pipeline(options)
            first.start()
            # Half done: two tasks finished (their rows written), the other two running.
            deadline = Deadline(240)
            while len({value.split("-")[1] for value, _ in calls_of(calls)}) <= 2:
                first.check_running()
                assert not deadline.passed(), f"no batch started:\n{tail(first.log)}"
                reader.poll(0.2)
            before = first.log.read_bytes()
            stopping = time.monotonic()
            assert first.interrupt() == 0, tail(first.log)
            took = time.monotonic() - stopping
            said = first.log.read_bytes()[len(before) :].decode().splitlines()
            # Quiet and quick: the stop's own line, no Java stack, a Spark warning at most.
            assert [line for line in said if " WARN " not in line] == [
                "redrive spark pipeline: stopped"
            ], said
            assert not [line for line in said if line.startswith("\tat ")]
            print(f"Ctrl-C mid-batch: stopped in {took:.1f} s")
            handled_before = len(calls_of(calls))
            assert handled_before < len(sent), "the batch ended before it was stopped"

            again = pipeline(options)
            again.start()
            retries = {v for v in sent if v.startswith(b"retry-")}
            dead = {v for v in sent if v.startswith(b"dead-")}
            deadline = Deadline(300)
            while True:
                again.check_running()
                results = {m.value for m in reader.of(output)}
                done = {
                    v
                    for v in sent
                    if v.startswith(b"fine-")
                    and f"handled {v.decode()} at attempt 1".encode() in results
                }
                done |= {
                    v for v in retries if f"handled {v.decode()} at attempt 2".encode() in results
                }
                if done == retries | (sent - retries - dead) and len(dead_letters(db)) >= len(dead):
                    break
                assert not deadline.passed(), (
                    f"{len(done)} handled, {len(dead_letters(db))} dead letters:\n{tail(again.log)}"
                )
                reader.poll(0.5)
            # Every request the two runs wrote was read by the service; the re-run batch's
            # repeats of the first run's were dropped, counted.
            requests = settings.requests_topic
            deadline = Deadline(60)
            while received(service) != len(reader.of(requests)) or not reader.of(requests):
                assert not deadline.passed(), (
                    f"the service read {received(service)} of {len(reader.of(requests))} requests"
                )
                reader.poll(0.5)
            written = [dict(m.headers).get(ID) for m in reader.of(requests)]
            assert None not in written, "every request carries its redrive-id"
            if delivery == "exactly-once":
                assert len(written) == len(set(written)), "a request written twice"
                assert repeats(service) == 0
                results = Counter(m.value for m in reader.of(output))
                assert [r for r, n in results.items() if n > 1] == [], "a result written twice"
            else:
                assert repeats(service) == len(written) - len(set(written)) > 0, (
                    "the re-run batch repeated nothing"
                )
            letters = dead_letters(db)
            print(
                f"stopped after {handled_before} handler calls; {len(written)} requests written, "
                f"{len(set(written))} distinct, {repeats(service):.0f} repeats dropped"
            )
        finally:
            reader.close()

    delivered = Counter(
        dict(m.headers).get(ID) for m in reader.of(source) if dict(m.headers).get(ID)
    )
    assert len(delivered) == len(retries), "each retry delivered"
    assert [n for n in delivered.values() if n > 1] == [], "a retry delivered twice"
    stored = Counter(bytes(letter["msg_value"]) for letter in letters)
    assert set(stored) == dead
    assert [v for v, n in stored.items() if n > 1] == [], "a dead letter stored twice"
