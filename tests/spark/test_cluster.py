"""The pipeline and the Spark scheduler on a real Spark standalone cluster, not local[2].

A master and two workers start on loopback from the installed PySpark (as `redrive
local up --spark` starts them), in this test's own folder on free ports. The job
(tests/spark/cluster_job.py) is submitted with spark-submit, the connector jars passed
with --jars as a cluster user would. 400 records go through; some fail once and come
back through the Spark scheduler, some are dead letters. Once results are flowing, one
worker is killed with SIGKILL: its executor dies with it, and Spark runs the lost
tasks again on the executor left. Then every record must be accounted for: each good
one handled, each fatal one dead-lettered, each retry delivered (never before due) and
handled. Both queries write exactly once (their default): a read_committed reader
sees each result, retry request, delivery and dead letter once, the lost tasks'
re-runs included.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from redrive.deadlines import Deadline
from redrive.headers import decode
from redrive.local.spark_cluster import LocalSparkCluster, SparkDaemon, spark_home
from redrive.ports import free_port
from redrive.spark import connector_jars
from tests.integration.consumer_harness import wait_for
from tests.integration.service_harness import produce
from tests.spark import Received, TopicReader, create_topics, running_cluster, unique
from tests.spark.cluster_job import is_fatal, is_flaky

pytestmark = [pytest.mark.spark, pytest.mark.serial]

JOB = Path(__file__).with_name("cluster_job.py")
RECORDS = 400
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    """Everything the cluster, the driver and the executors write: removed at the end."""
    root = tmp_path / "spark-cluster"
    root.mkdir()
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def cluster(cluster_dir: Path) -> Iterator[LocalSparkCluster]:
    with running_cluster(cluster_dir / "cluster", workers=2) as cluster:
        yield cluster


def submit(
    cluster: LocalSparkCluster,
    folder: Path,
    log: Path,
    jars: list[Path],
    ui_port: int,
    args: list[str],
) -> subprocess.Popen[bytes]:
    """spark-submit the job to the cluster, in client mode (the driver runs here)."""
    driver_tmp, executor_tmp = folder / "driver-tmp", folder / "executor-tmp"
    for path in (driver_tmp, executor_tmp, folder / "driver-local"):
        path.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.update(
        # The suite's spark-defaults.conf (tests/spark-conf), as a cluster's own would be.
        SPARK_CONF_DIR=os.environ["SPARK_CONF_DIR"],
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        # On this one machine the executors run this venv's Python, which has redrive;
        # a real cluster ships it (--py-files or a wheel: docs/spark.md, "Running on a cluster").
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        TMPDIR=str(driver_tmp),
    )
    settings = {
        "spark.executor.cores": "1",
        "spark.executor.memory": "512m",
        "spark.cores.max": "2",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.port": str(ui_port),
        "spark.ui.showConsoleProgress": "false",
        "spark.local.dir": str(folder / "driver-local"),
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={driver_tmp}",
        "spark.executor.extraJavaOptions": f"-Djava.io.tmpdir={executor_tmp}",
    }
    command = [
        str(spark_home() / "bin" / "spark-submit"),
        "--master",
        cluster.master_url(),
        "--deploy-mode",
        "client",
        "--driver-memory",
        "768m",
        "--jars",
        ",".join(str(jar) for jar in jars),
        *[part for key, value in settings.items() for part in ("--conf", f"{key}={value}")],
        str(JOB),
        *args,
    ]
    with open(log, "ab") as out:
        return subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=folder,
            start_new_session=True,
        )


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_until(
    what: str,
    done: Callable[[], bool],
    timeout_s: float,
    reader: TopicReader,
    driver: subprocess.Popen[bytes],
) -> None:
    """Poll the topics until ``done()``; fail if the driver exits or the deadline passes."""
    deadline = Deadline(timeout_s)
    while not done():
        if driver.poll() is not None:
            pytest.fail(f"the driver exited ({driver.returncode}) before {what}")
        if deadline.passed():
            pytest.fail(f"not within {deadline.describe()}: {what}")
        reader.poll(0.5)


def executors_of(worker: SparkDaemon) -> list[psutil.Process]:
    """The executor JVMs a worker started (its children running the executor backend)."""
    record = worker.pid_record()
    found = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(record.pid if record else -1).children():
            # Not every child is an executor, nor alive: a zombie has no command line.
            with contextlib.suppress(psutil.Error):
                if any("CoarseGrainedExecutorBackend" in part for part in child.cmdline()):
                    found.append(child)
    return found


def executor_id(process: psutil.Process) -> str | None:
    """The application's id of an executor JVM (its --executor-id argument)."""
    with contextlib.suppress(psutil.Error, ValueError, IndexError):
        args = process.cmdline()
        return args[args.index("--executor-id") + 1]
    return None


def busy_executors(ui_port: int) -> set[str]:
    """The ids of the executors running a task now, from the driver's REST API."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    base = f"http://127.0.0.1:{ui_port}/api/v1/applications"
    with contextlib.suppress(OSError, ValueError, LookupError):
        with opener.open(base, timeout=2) as response:
            app = json.load(response)[0]["id"]
        with opener.open(f"{base}/{app}/executors", timeout=2) as response:
            return {e["id"] for e in json.load(response) if e.get("activeTasks", 0) > 0}
    return set()


def busy_worker(
    cluster: LocalSparkCluster, ui_port: int, reader: TopicReader
) -> tuple[SparkDaemon, list[psutil.Process], bool]:
    """A worker whose executor runs a task right now (so that killing it interrupts
    one), or any worker with an executor if none is seen busy within 30 s; and whether
    it was busy."""
    deadline = Deadline(30)
    while True:
        workers = [(w, executors_of(w)) for w in cluster.workers()]
        workers = [(w, found) for w, found in workers if found]
        assert workers, "no worker runs an executor"
        busy = busy_executors(ui_port)
        for worker, found in workers:
            if any(executor_id(e) in busy for e in found):
                return worker, found, True
        if deadline.passed():
            return *workers[0], False
        reader.poll(0.05)


def keep_logs(folder: Path, target: Path) -> Path:
    """Copy the logs (driver, daemons, executors' stdout and stderr) out of the folder
    the test deletes, for a failure to be read."""
    shutil.rmtree(target, ignore_errors=True)
    for path in folder.rglob("*"):
        where = path.relative_to(folder).parts
        logs = len(where) <= 2 or "work" in where  # not RocksDB's *.log files
        if path.is_file() and logs and (path.suffix == ".log" or path.name in ("stdout", "stderr")):
            copy = target / path.relative_to(folder)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, copy)
    return target


def stop_driver(driver: subprocess.Popen[bytes]) -> int:
    """SIGTERM the Python driver (it stops its queries and the session), then wait for
    spark-submit to exit; kill the whole process group if it will not."""
    if driver.poll() is None:
        python = []
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(driver.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if any(str(JOB) in part for part in child.cmdline()):
                        python.append(child)
        print(f"stopping the driver: SIGTERM to {python}")
        for process in python:
            process.send_signal(signal.SIGTERM)
        try:
            driver.wait(90)
        except subprocess.TimeoutExpired:
            for process in python:  # its Python stacks, into the driver's log
                with contextlib.suppress(psutil.Error):
                    process.send_signal(signal.SIGUSR1)
            time.sleep(2)
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)
    return driver.returncode


def values(messages: list[Received]) -> Counter[int]:
    """How many times each record number came, from records as produced."""
    return Counter(int(m.value or b"") for m in messages)


def handled(messages: list[Received]) -> Counter[int]:
    """How many times each record number came, from the handler's results."""
    return Counter(json.loads(m.value or b"")["n"] for m in messages)


def duplicates(counter: Counter[int]) -> int:
    return sum(counter.values()) - len(counter)


def test_pipeline_and_scheduler_on_a_cluster_survive_a_lost_worker(
    cluster: LocalSparkCluster, cluster_dir: Path, bootstrap: str, output_dir: Path
) -> None:
    jars = connector_jars()  # first: without the connector, nothing starts
    source, output = unique("cluster-orders"), unique("cluster-out")
    requests, dlq = unique("cluster-requests"), unique("cluster-dlq")
    create_topics(bootstrap, source, requests, partitions=2)
    create_topics(bootstrap, output, dlq)
    produce(
        bootstrap,
        source,
        [{"key": f"k{n}".encode(), "value": str(n).encode()} for n in range(RECORDS)],
    )
    fatal = {n for n in range(RECORDS) if is_fatal(n)}
    flaky = {n for n in range(RECORDS) if is_flaky(n)} - fatal
    good = set(range(RECORDS)) - fatal

    reader = TopicReader(bootstrap, [output, requests, dlq, source])
    log = cluster_dir / "driver.log"
    started = time.monotonic()
    driver: subprocess.Popen[bytes] | None = None
    ui_port = free_port()  # the driver's UI: its REST API says which executor is busy

    def redelivered() -> list[Received]:
        return [m for m in reader.of(source) if m.header("redrive-retry-at") is not None]

    try:
        driver = submit(
            cluster,
            cluster_dir,
            log,
            jars,
            ui_port,
            [
                *("--bootstrap", bootstrap, "--source", source, "--output", output),
                *("--requests", requests, "--dlq", dlq),
                *("--checkpoints", str(cluster_dir / "checkpoints")),
            ],
        )
        # Mid-run: results are flowing, most records are still to come.
        wait_until("the first results", lambda: len(reader.of(output)) >= 40, 240, reader, driver)
        first_results = time.monotonic() - started
        victim, executors, busy = busy_worker(cluster, ui_port, reader)
        done_before = len(handled(reader.of(output)))
        record = victim.pid_record()
        assert record is not None
        os.kill(record.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        print(
            f"\nfirst results {first_results:.1f} s after spark-submit; killed {victim.name} "
            f"(pid {record.pid}, executor pid {[e.pid for e in executors]}) "
            f"{'while it ran a task' if busy else 'between tasks'}, with "
            f"{done_before} of {len(good)} results in"
        )
        # Its executor dies with it (an executor watches its worker and exits).
        _, alive = psutil.wait_procs(executors, timeout=60)
        assert not alive, f"executor(s) {alive} outlived their worker"
        assert done_before < len(good), "the run was over before the worker was killed"

        def accounted() -> bool:
            return (
                set(handled(reader.of(output))) >= good
                and set(values(reader.of(dlq))) >= fatal
                and set(values(redelivered())) >= flaky
            )

        wait_until("every record accounted for", accounted, 300, reader, driver)
        finished = time.monotonic()
        reader.poll(3)  # duplicates or strays would show up here
        assert driver.poll() is None, "the driver exited"
        driver_log = log.read_text(errors="replace")
        assert "Lost executor" in driver_log, "the driver did not see an executor go"
        # Tasks that were running on the lost executor, which Spark ran again on the
        # other ("... its executor exited for a reason unrelated to the task"), and
        # stages run again because shuffle output went with it.
        lines = driver_log.splitlines()
        rerun = sum("its executor exited" in line for line in lines)
        resubmitted = sum("Resubmitting" in line and "fetch failure" in line for line in lines)
        # The master drops the lost worker when its connection goes, or at the latest
        # when its heartbeats stop for spark.worker.timeout (60 s).
        wait_for(lambda: cluster.status().workers_alive == 1, 120)
        assert cluster.status().workers_alive == 1

        outputs = handled(reader.of(output))
        letters = values(reader.of(dlq))
        requested = [r for r in reader.of(requests) if r.header("redrive-send-to") == b"retry"]
        retries = values(requested)
        came_back = values(redelivered())
        print(
            f"{RECORDS} records: {outputs.total()} results for {len(outputs)} records "
            f"({duplicates(outputs)} duplicates), {letters.total()} dead letters for "
            f"{len(letters)} ({duplicates(letters)} duplicates), {retries.total()} retry "
            f"requests for {len(retries)} ({duplicates(retries)} duplicates), "
            f"{came_back.total()} retries delivered for {len(came_back)} "
            f"({duplicates(came_back)} duplicates); {rerun} task(s) lost with the "
            f"executor and run again, {resubmitted} stage(s) resubmitted for lost shuffle "
            "output; all accounted for "
            f"{finished - killed_at:.1f} s after the kill, {finished - started:.1f} s "
            "after spark-submit"
        )
        # Nothing lost, nothing invented; the pipeline's outputs once each.
        assert set(outputs) == good
        assert duplicates(outputs) == 0, "a result written twice"
        assert duplicates(values(reader.of(requests))) == 0, "a request written twice"
        assert duplicates(letters) == 0, "a dead letter written twice"
        assert duplicates(came_back) == 0, "a retry delivered twice"
        assert set(letters) == fatal
        assert set(retries) == flaky
        assert set(came_back) == flaky
        for message in reader.of(output):
            result = json.loads(message.value or b"")
            assert result["attempt"] == (2 if result["n"] in flaky else 1), result
        for message in redelivered():  # never before due
            headers, _ = decode(message.headers)
            assert message.timestamp_ms >= headers.retry_at
        for message in reader.of(dlq):
            assert message.header("redrive-error-type") == b"ValueError"

        # SIGTERM: the driver stops its queries and its session, and exits cleanly.
        assert stop_driver(driver) == 0
    except BaseException:
        kept = keep_logs(cluster_dir, output_dir / "spark-cluster")
        print(f"driver log (all logs kept in {kept}):\n{tail(log, 60)}")
        raise
    finally:
        if driver is not None:
            stop_driver(driver)
        reader.close()
