"""Supervised queries on real Spark (local mode): a query that fails is started again
from its checkpoint and resumes with the batch that failed; one that fails more often
than its restarts allow ends the run with its failure, the other queries stopped.

The failures are raised by a ``foreachBatch`` function, which Spark runs on the
driver: the query ends with a ``StreamingQueryException`` as it does when a driver
cannot start a Python worker in time or loses its broker for good.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from structlog.testing import capture_logs

from redrive.deadlines import Deadline
from redrive.errors import ConfigError
from redrive.spark.session import run_until_stopped, spark_session, stop_with_jvm
from redrive.spark.supervision import Restarts, Supervised

pytestmark = pytest.mark.spark

QUICK = Restarts(at_most=2, within_s=60, pause_s=0.1)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("redrive-test-supervision")
    yield session
    stop_with_jvm(session)


def ticking(
    spark: Any, name: str, checkpoint: Path, on_batch: Callable[[int], None]
) -> Callable[[], Any]:
    """A starter of a query of one row per batch that calls ``on_batch(batch_id)``."""

    def start() -> Any:
        return (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", 1)
            .load()
            .writeStream.foreachBatch(lambda df, batch_id: on_batch(batch_id))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="100 milliseconds")
            .queryName(name)
            .start()
        )

    return start


class Running:
    """``run_until_stopped`` in a thread: what it raised, once it returns."""

    def __init__(self, queries: list[Any]) -> None:
        self.raised: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(queries,), daemon=True)
        self.thread.start()

    def _run(self, queries: list[Any]) -> None:
        try:
            run_until_stopped(queries, poll_s=0.1)
        except BaseException as exc:  # the test asserts on it
            self.raised = exc

    def returned(self, timeout_s: float) -> bool:
        self.thread.join(timeout_s)
        return not self.thread.is_alive()


def wait_for(what: str, done: Callable[[], bool], timeout_s: float = 120) -> None:
    deadline = Deadline(timeout_s)
    while not done():
        assert not deadline.passed(), f"no {what} within {timeout_s} s"
        threading.Event().wait(0.1)


def test_a_failed_query_is_started_again_and_resumes_with_the_batch_that_failed(
    spark: Any, tmp_path: Path
) -> None:
    seen: list[int] = []
    failures_left = [1]

    def on_batch(batch_id: int) -> None:
        seen.append(batch_id)
        if batch_id == 2 and failures_left[0]:
            failures_left[0] -= 1
            raise ConnectionError("the broker went away")

    supervised = Supervised(ticking(spark, "flaky", tmp_path / "flaky", on_batch), QUICK)
    first = supervised.query
    with capture_logs() as events:
        running = Running([supervised])
        try:
            wait_for("batch 4 after the restart", lambda: 4 in seen)
        finally:
            supervised.stop()
        assert running.returned(60), "run_until_stopped did not return after the stop"
    assert running.raised is None
    assert supervised.restarted == 1
    assert supervised.query is not first
    # The checkpoint had batches 0 and 1: the new query ran 2 again, then went on.
    assert seen[:5] == [0, 1, 2, 2, 3]
    restarts = [e for e in events if e["event"].startswith("query failed; starting it again")]
    assert len(restarts) == 1
    assert restarts[0]["query"] == "flaky"
    assert "the broker went away" in restarts[0]["error"]
    assert restarts[0]["log_level"] == "warning"


def test_a_query_failing_past_its_restarts_raises_and_the_others_stop(
    spark: Any, tmp_path: Path
) -> None:
    def always_fail(batch_id: int) -> None:
        raise ConnectionError(f"down in batch {batch_id}")

    broken = Supervised(ticking(spark, "broken", tmp_path / "broken", always_fail), QUICK)
    steady = Supervised(ticking(spark, "steady", tmp_path / "steady", lambda batch_id: None))
    with capture_logs() as events:
        running = Running([steady, broken])
        assert running.returned(180), "run_until_stopped went on past the restarts"
    assert isinstance(running.raised, StreamingQueryException)
    assert "down in batch 0" in str(running.raised)
    assert broken.restarted == 2
    assert not steady.query.isActive, "the other query was left running"
    assert [e["log_level"] for e in events if e.get("query") == "broken"] == [
        "warning",
        "warning",
        "error",
    ]


def test_an_unsupervised_query_that_fails_ends_the_run_with_its_failure(
    spark: Any, tmp_path: Path
) -> None:
    def fail(batch_id: int) -> None:
        raise ConnectionError("no restart for me")

    query = ticking(spark, "plain", tmp_path / "plain", fail)()
    running = Running([query])
    assert running.returned(120)
    assert isinstance(running.raised, StreamingQueryException)
    assert "no restart for me" in str(running.raised)


@pytest.mark.parametrize(
    ("restarts", "setting"),
    [
        ({"at_most": -1}, "restarts.at_most"),
        ({"within_s": 0}, "restarts.within_s"),
        ({"pause_s": -0.5}, "restarts.pause_s"),
    ],
)
def test_restarts_out_of_range_stop_at_start_naming_the_setting(
    restarts: dict[str, float], setting: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        Restarts(**restarts)  # type: ignore[arg-type]
    assert refused.value.setting == setting
