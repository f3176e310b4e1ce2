"""`redrive spark pipeline MODULE:HANDLER ...` as a user runs it: a process that routes
each outcome where the pipeline says and stops cleanly on SIGTERM, and its mistakes,
each one line naming the option, in a second and without starting Spark. The same
command as spark-submit's main file on a standalone cluster is in
test_cluster_recipe.py.

The handlers are in tests/spark/pipeline_handlers.py, named as the command line names
them: `tests.spark.pipeline_handlers:handle` from the repository's root.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from redrive.deadlines import Deadline
from redrive.headers import decode
from redrive.ports import free_port
from tests.integration.consumer_harness import wait_for
from tests.integration.service_harness import produce
from tests.plugins.leftovers import MARK
from tests.spark import Received, TopicReader, scrape

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
HANDLERS = "tests.spark.pipeline_handlers"


def child_env(**extra: str) -> dict[str, str]:
    """This environment without redrive's settings, and without the variables through
    which PySpark would think it runs under spark-submit. SPARK_CONF_DIR stays: the
    suite's spark-defaults.conf (tests/spark-conf) keeps the child's JVMs, and the
    executors it starts, at the JIT's first tier like every other JVM of the suite; so
    does the suite's mark, by which no process the child starts outlives the test run
    unnoticed (tests/plugins/leftovers.py)."""
    kept = {"SPARK_CONF_DIR", MARK}
    env = {
        k: v
        for k, v in os.environ.items()
        if k in kept or not k.startswith(("REDRIVE_", "PYSPARK_", "SPARK_", "_PYSPARK"))
    }
    return {**env, **extra}


def redrive_spark_pipeline(*args: str) -> list[str]:
    return [sys.executable, "-m", "redrive.cli", "spark", "pipeline", *args]


def pipeline_options(
    bootstrap: str, source: str, output: str, requests: str, checkpoint: Path, handlers: str
) -> list[str]:
    return [
        *("--source", source, "--output", output, "--requests-topic", requests),
        *("--group", "billing", "--policy", "1s x3", "--checkpoint", str(checkpoint)),
        *("--retry-on", f"{handlers}.Declined", "--fatal-on", "ValueError"),
        *("--trigger", "500 milliseconds", "--bootstrap", bootstrap),
    ]


def produce_the_three_cases(bootstrap: str, source: str) -> None:
    produce(
        bootstrap,
        source,
        [{"key": value, "value": value} for value in (b"fine", b"declined", b"broken")],
    )


def wait_for_outcomes(
    reader: TopicReader, output: str, requests: str, process: subprocess.Popen[bytes], log: Path
) -> None:
    """Until the result and the two requests are in, with a deadline; fail at once if
    the command exits."""
    deadline = Deadline(240)
    while len(reader.of(output)) < 1 or len(reader.of(requests)) < 2:
        if process.poll() is not None:
            pytest.fail(f"the command exited ({process.returncode}):\n{tail(log)}")
        if deadline.passed():
            pytest.fail(f"no result and two requests within {deadline.describe()}:\n{tail(log)}")
        reader.poll(0.5)


def check_outcomes(
    reader: TopicReader, source: str, output: str, requests: str, handlers: str
) -> None:
    """The success on the output topic; the retryable failure and the fatal one on the
    requests topic, with the contract's headers."""
    assert [(m.key, m.value) for m in reader.of(output)] == [
        (b"fine", b"handled fine at attempt 1")
    ]
    by_key: dict[bytes | None, Received] = {}
    for message in reader.of(requests):  # each key's first (retries may follow)
        by_key.setdefault(message.key, message)
    assert set(by_key) == {b"declined", b"broken"}
    retry, retry_user_headers = decode(by_key[b"declined"].headers)
    assert retry_user_headers == []
    assert by_key[b"declined"].value == b"declined"  # the record itself, untouched
    assert retry.send_to == "retry"
    assert retry.destination == source
    assert retry.attempt == 1
    assert retry.group == "billing"
    assert (retry.original_topic, retry.original_offset) == (source, 1)
    assert retry.error_type == f"{handlers}.Declined"
    assert retry.error_message == "declined at attempt 1"
    assert retry.original_timestamp is not None
    assert retry.retry_at >= retry.original_timestamp + 1_000  # "1s x3": 1 s after it failed
    dead, _ = decode(by_key[b"broken"].headers)
    assert dead.send_to == "dlq"
    assert dead.reason is not None and dead.reason.startswith("fatal error: ValueError")
    assert (dead.original_topic, dead.original_offset) == (source, 2)


def tail(path: Path, lines: int = 40) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


def test_the_command_routes_each_outcome_and_stops_on_sigterm(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    source, output, requests = new_topic("cmd-orders"), new_topic("cmd-out"), new_topic("cmd-req")
    log = tmp_path / "pipeline.log"
    options = pipeline_options(bootstrap, source, output, requests, tmp_path / "ckpt", HANDLERS)
    metrics_port = free_port()
    options += ["--metrics-port", str(metrics_port)]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            redrive_spark_pipeline(f"{HANDLERS}:handle", *options),
            cwd=REPO,  # the handler's module is found from the current directory
            env=child_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    reader = TopicReader(bootstrap, [output, requests])
    try:
        produce_the_three_cases(bootstrap, source)
        wait_for_outcomes(reader, output, requests, process, log)
        check_outcomes(reader, source, output, requests, HANDLERS)
        # The query's metrics count each outcome once its batch's progress is in.
        query = 'query="redrive-pipeline-billing"'
        counted = {
            f'redrive_spark_records_total{{outcome="{outcome}",{query}}} 1.0'
            for outcome in ("results", "retried", "dead_lettered")
        }
        assert wait_for(lambda: counted <= set(scrape(metrics_port).splitlines()), 60), scrape(
            metrics_port
        )
    finally:
        reader.close()
        process.send_signal(signal.SIGTERM)
        code = process.wait(90)
    assert code == 0, tail(log)
    assert f"redrive spark pipeline: {HANDLERS}:handle on kafka {bootstrap}" in log.read_text()


# Mistakes: each is refused before Spark starts (no JVM: Spark's first log line, about
# log4j, never shows), with exit code 2 and a message naming the option.

NO_BROKER = "127.0.0.1:9"  # checks made before the broker's must not need one


@pytest.mark.parametrize(
    ("handler", "extra", "setting", "problem"),
    [
        ("no_such_module:handle", [], "MODULE:HANDLER", "no module named 'no_such_module'"),
        (f"{HANDLERS}:nope", [], "MODULE:HANDLER", "has no attribute 'nope'"),
        (f"{HANDLERS}:handle_async", [], "MODULE:HANDLER", "is an async function"),
        (f"{HANDLERS}:NOT_A_FUNCTION", [], "MODULE:HANDLER", "is a str, not a function"),
        (HANDLERS, [], "MODULE:HANDLER", "is not of the form MODULE:HANDLER"),
        (f"{HANDLERS}:handle", ["--policy", "5 x3"], "--policy", "missing unit"),
        (f"{HANDLERS}:handle", ["--retry-on", f"{HANDLERS}.handle"], "--retry-on", "not an"),
        (f"{HANDLERS}:handle", ["--restarts", "-1"], "--restarts", "-1 is not a number"),
    ],
)
def test_a_mistake_is_one_line_naming_the_option(
    handler: str, extra: list[str], setting: str, problem: str, tmp_path: Path
) -> None:
    options = ["--source", "s", "--output", "o", "--group", "g", "--policy", "1s"]
    options += ["--checkpoint", str(tmp_path / "ckpt"), "--bootstrap", NO_BROKER, *extra]
    result = run_to_the_end(redrive_spark_pipeline(handler, *options))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"redrive: {setting}: "), result.stderr
    assert problem in result.stderr
    assert "Traceback" not in result.stderr and "log4j" not in result.stderr


def test_the_module_missing_says_where_it_was_looked_for(tmp_path: Path) -> None:
    options = ["--source", "s", "--output", "o", "--group", "g", "--policy", "1s"]
    options += ["--checkpoint", str(tmp_path / "ckpt"), "--bootstrap", NO_BROKER]
    result = run_to_the_end(redrive_spark_pipeline("orders:charge", *options), cwd=tmp_path)
    assert result.returncode == 2
    assert f"searched the current directory {tmp_path} and PYTHONPATH" in result.stderr


def test_the_installed_command_imports_from_the_current_directory(tmp_path: Path) -> None:
    """`redrive` as installed (its sys.path starts with its bin/ folder, not here)."""
    (tmp_path / "orders.py").write_text(
        "async def charge(key, value, headers, attempt):\n    return value\n"
    )
    options = ["--source", "s", "--output", "o", "--group", "g", "--policy", "1s"]
    options += ["--checkpoint", str(tmp_path / "ckpt"), "--bootstrap", NO_BROKER]
    redrive = Path(sys.executable).with_name("redrive")
    result = run_to_the_end(
        [str(redrive), "spark", "pipeline", "orders:charge", *options], tmp_path
    )
    assert result.returncode == 2, result.stderr
    # Found and imported (./orders.py), then refused for what it is.
    assert result.stderr.startswith("redrive: MODULE:HANDLER: orders:charge is an async function")


def test_a_source_topic_that_does_not_exist_is_refused(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    output, requests = new_topic("cmd-out"), new_topic("cmd-req")
    missing = f"no-such-topic-{tmp_path.name}"
    options = pipeline_options(bootstrap, missing, output, requests, tmp_path / "ckpt", HANDLERS)
    result = run_to_the_end(redrive_spark_pipeline(f"{HANDLERS}:handle", *options))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("redrive: --source: "), result.stderr
    assert f"no topic {missing!r} (--source) on the broker at {bootstrap}" in result.stderr
    assert "log4j" not in result.stderr


def run_to_the_end(command: list[str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=60, check=False
    )
