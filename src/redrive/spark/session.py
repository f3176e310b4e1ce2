"""A SparkSession with the official Kafka connector and settings that suit redrive.

The connector (`spark-sql-kafka-0-10_2.13`, same version as PySpark) is not part of
PySpark. :func:`connector_jars` fetches it once from Maven Central into redrive's jar
cache (see :mod:`redrive.jars`) and returns only the jars PySpark does not ship
already: the connector, its token provider, `kafka-clients` and `commons-pool2`.
Passing the rest (Hadoop, Scala, slf4j...) again would put a second copy of them on
the class path.

:func:`spark_session` builds a session for local work and tests: few shuffle
partitions (one micro-batch of a small stream should not run 200 tasks), the RocksDB
state store provider (which `transformWithStateInPandas` requires), no web UI, log
level WARN. Pass ``conf`` to override any of it, ``master`` to run on a cluster.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from redrive import jars

CONNECTOR_POM: Final = "spark-kafka-pom.xml"
PANDAS_3_WARNING: Final = "PySpark does not yet fully support pandas"
LOG_LEVEL: Final = "spark.log.level"
LOG_CONFIG: Final = Path(__file__).with_name("log4j2.properties")
ROCKSDB_PROVIDER: Final = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

# Artifact name prefixes of the connector jars PySpark does not ship itself.
_CONNECTOR_ARTIFACTS: Final = (
    "spark-sql-kafka-0-10_",
    "spark-token-provider-kafka-0-10_",
    "kafka-clients-",
    "commons-pool2-",
)


def connector_jars(*, quiet: bool = True) -> list[Path]:
    """The Kafka connector's jars that PySpark lacks, fetched into the cache on first use.

    Raises :class:`redrive.errors.ConfigError` when Maven is needed and missing or the
    download fails, and when an expected jar is not in the fetched folder.
    """
    from redrive.errors import ConfigError

    folder = jars.fetch(CONNECTOR_POM, "the Spark Kafka connector jars", quiet=quiet)
    found: list[Path] = []
    for prefix in _CONNECTOR_ARTIFACTS:
        matches = sorted(folder.glob(f"{prefix}*.jar"))
        if not matches:
            raise ConfigError(
                "spark.jars",
                f"no {prefix}*.jar in {folder}",
                f"delete {folder} so that the connector is fetched again",
            )
        found.append(matches[-1])
    return found


def default_conf(*, shuffle_partitions: int = 2) -> dict[str, str]:
    """The settings :func:`spark_session` applies unless overridden."""
    return {
        "spark.jars": ",".join(str(p) for p in connector_jars()),
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        # Smaller, faster checkpoints of the RocksDB state: a change log per batch
        # instead of uploading a snapshot of the whole database.
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        # The Python workers: without PySpark's pandas-3 warning (see spark_session).
        "spark.executorEnv.PYTHONWARNINGS": f"ignore:{PANDAS_3_WARNING}:FutureWarning",
        # The driver's log: Spark's warnings and errors, less the known noise.
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG_CONFIG}",
    }


def spark_session(
    app_name: str = "redrive",
    *,
    master: str | None = "local[2]",
    shuffle_partitions: int = 2,
    conf: Mapping[str, str] | None = None,
    log_level: str = "WARN",
) -> Any:
    """Get or create a SparkSession with the Kafka connector on its class path.

    ``master=None`` leaves the master to ``spark-submit``. Settings in ``conf`` win
    over :func:`default_conf`. Returns a ``pyspark.sql.SparkSession``.
    """
    from pyspark.sql import SparkSession

    # PySpark 4.2 warns on every pandas 3 import that it "does not yet fully support"
    # it. redrive.spark is written for pandas 3 (see the spark extra in pyproject) and
    # its whole suite runs on this PySpark with it: the warning would only alarm users
    # about the combination redrive supports.
    warnings.filterwarnings("ignore", message=PANDAS_3_WARNING, category=FutureWarning)
    # Python workers run the handlers: in this interpreter (its venv has redrive and
    # the user's code), not whatever `python3` is first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = {**default_conf(shuffle_partitions=shuffle_partitions), **(conf or {})}
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if LOG_LEVEL not in settings:  # Spark's own setting, when given, says otherwise
        spark.sparkContext.setLogLevel(log_level)
    return spark


def run_until_stopped(queries: Sequence[Any], *, poll_s: float = 0.5) -> None:
    """Block until Ctrl-C or SIGTERM, or until one of the streaming queries ends.

    ``queries`` are started queries or :class:`redrive.spark.supervision.Supervised`
    ones, which are started again from their checkpoints when they fail (within their
    ``Restarts``). Then stop every query (a running micro-batch is interrupted; it is
    run again on the next start, from the checkpoint) and return, or raise the
    exception of a query that failed. PySpark's own Ctrl-C handler calls into the JVM
    from inside the signal handler, which breaks a blocking ``awaitTermination()``;
    here the signals only set a flag, and the queries are polled.
    """
    from redrive.spark.supervision import Supervised, Unsupervised, Watched

    watched: list[Watched] = [q if isinstance(q, Supervised) else Unsupervised(q) for q in queries]
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    handlers: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            handlers[sig] = signal.signal(sig, on_signal)
    try:
        while not stop.is_set():
            for query in watched:
                if query.ended(poll_s / max(len(watched), 1), stop):
                    return  # it ended; one that failed raised its exception instead
    finally:
        if stop.is_set():
            silence_logs()
        for query in watched:
            query.stop()
        for sig, previous in handlers.items():
            signal.signal(sig, previous)


def silence_logs() -> None:
    """Spark's log off, every logger of it. For a stop: the tasks interrupted say so at
    length (aborted writes, killed tasks, state stores that cannot commit), all of it
    expected, none of it the user's to read; the session ends next, with its log."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None or context._jvm is None:
        return
    # Every logger, not only the root: loggers given a level of their own (the log
    # configuration's) would go on.
    log4j = context._jvm.org.apache.logging.log4j
    log4j.core.config.Configurator.setAllLevels(log4j.LogManager.ROOT_LOGGER_NAME, log4j.Level.OFF)


def stop_with_jvm(session: Any) -> None:
    """Stop the session's queries, the session, and the JVM PySpark started for it.
    The JVM keeps the Kafka connector's producers cached after ``stop()``, which go on
    logging connection errors once their broker is gone: a program that stops its
    broker after Spark (a benchmark, a test) ends the JVM too. A later session starts
    a new one."""
    from pyspark import SparkContext

    for query in session.streams.active:
        query.stop()
    session.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    jvm_process = getattr(gateway, "proc", None)  # set by PySpark's launch_gateway
    gateway.shutdown()
    if jvm_process is not None:
        jvm_process.terminate()
        jvm_process.wait(30)
    SparkContext._gateway = None
    SparkContext._jvm = None
