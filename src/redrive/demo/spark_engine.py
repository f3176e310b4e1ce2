"""The Spark engine of the demo, on the driver: the session, the query, its narration.

:class:`SparkEngine` starts a SparkSession (``local[2]``, :func:`redrive.spark.spark_session`)
and one PySpark Structured Streaming query (:func:`redrive.spark.start_pipeline`,
consumer group ``items-spark``) that reads `create-item` and `update-item` and runs
:class:`redrive.demo.spark_items.SparkItemHandler` on the executors. Its retries go
through the retry service (requests topic) and come back on its own per-group topics
``items-spark.<topic>.retry``, so the Python App (group ``items``) never sees them;
its dead letters go to the same retry service store as the App's.

Spark stays off the terminal: its log4j2 configuration (written next to its log)
keeps Spark at WARN, and the JVM's stdout and stderr, where that logging goes, are
the file ``spark.log`` in the demo's folder of the stack's state folder. The JVM also
prints a line log4j cannot silence ("WARNING: Using incubator modules:
jdk.incubator.vector", from the module options Spark 4's launcher always passes),
which is why its output is a file rather than the terminal.

The handler cannot reach the driver's narrator, so :class:`SparkWatcher` narrates the
query from what it writes to Kafka: its retry requests and dead letters on the
requests topic (headers ``redrive-group: items-spark``, attempt, error, retry-at) and
what it applied on its output topic.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from redrive.client_logs import with_client_logs
from redrive.deadlines import Deadline
from redrive.demo.spark_items import SparkItemHandler, warm_up
from redrive.demo.store import CREATE_TOPIC, UPDATE_TOPIC, ItemNotFound
from redrive.headers import HeaderError, decode
from redrive.kafka import headers_of
from redrive.policy import Policy

SPARK_GROUP: Final = "items-spark"
OUTPUT_TOPIC: Final = "items-spark.applied"
"""What the Spark handler applied, one small JSON per event (see spark_items.applied)."""
MASTER: Final = "local[2]"
TRIGGER: Final = "500 milliseconds"

LOG4J2: Final = """\
# Spark's logging in the redrive demo: WARN and above (the NativeCodeLoader warning
# about native Hadoop libraries left out), to the JVM's stderr, which the demo writes
# to spark.log beside this file. Having a configuration also keeps Spark from
# printing "Using Spark's default log4j profile" and "Setting default log level".
status = error
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yyyy-MM-dd HH:mm:ss.SSS} %p %c{1}: %m%n%ex
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
logger.nativecode.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativecode.level = error
"""


class SparkFailed(Exception):
    """Spark or its query did not start, or the query failed."""


def retry_topics(group: str) -> list[str]:
    """The per-group retry topics of a group reading both item topics."""
    return [f"{group}.{topic}.retry" for topic in (CREATE_TOPIC, UPDATE_TOPIC)]


@contextlib.contextmanager
def _output_into(path: Path) -> Iterator[None]:
    """This process's stdout and stderr (fds 1 and 2) go to ``path`` meanwhile, so that
    a child started now (Spark's JVM) keeps writing there after they are restored."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(path, "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


class SparkEngine:
    """The Spark session and the items query; :meth:`stop` ends both and deletes the
    checkpoint.

    Every call into Spark is made from threads of its own, never from the caller's:
    Ctrl-C raises KeyboardInterrupt in the main thread, and one that lands in the
    middle of a py4j call leaves that thread's connection to the JVM unusable (the
    next call may hang). Starting the session off the main thread also keeps PySpark
    from installing its own SIGINT handler, which calls into the JVM itself.
    """

    def __init__(
        self,
        *,
        bootstrap: str,
        database_url: str,
        requests_topic: str,
        policy: Policy,
        folder: Path,
        start_timeout_s: float = 150.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.database_url = database_url
        self.requests_topic = requests_topic
        self.policy = policy
        self.folder = folder
        self.start_timeout_s = start_timeout_s
        self.log_path = folder / "spark.log"
        self.checkpoint = folder / "checkpoint"
        self.spark: Any = None
        self.query: Any = None
        self._starter: threading.Thread | None = None
        self._session_up = threading.Event()
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._error = ""

    def start(self) -> None:
        """Start the session; return once it is up (the query then starts in the
        background: see :meth:`wait_until_ready`). Needs the topics to exist. Raises
        :class:`SparkFailed` if the session did not start."""
        from redrive.spark import connector_jars

        shutil.rmtree(self.checkpoint, ignore_errors=True)  # a killed run's: start afresh
        self.folder.mkdir(parents=True, exist_ok=True)
        self.log_path.write_bytes(b"")
        connector_jars(quiet=False)  # fetched with Maven on first use, with progress
        self._starter = threading.Thread(target=self._start, name="spark-start", daemon=True)
        self._starter.start()
        while not self._session_up.wait(0.2):
            pass
        if self.spark is None:
            raise SparkFailed(f"Spark did not start: {self._error}")

    def wait_until_ready(self) -> None:
        """Return once the query has run its first micro-batch (the `latest` offsets it
        starts from are then fixed: events produced from now on are its to read) and
        Spark's Python workers have started. Raises :class:`SparkFailed` otherwise."""
        while not self._ready.wait(0.2):
            pass
        if self._error:
            raise SparkFailed(self._error)

    def stop(self) -> None:
        """Stop the query, then the session (at most a minute); delete the checkpoint.
        The JVM exits with this process (PySpark's gateway ends when its stdin closes)."""
        self._stopping.set()
        halting = threading.Thread(target=self._halt, name="spark-stop", daemon=True)
        halting.start()
        try:
            halting.join(60)
        finally:
            shutil.rmtree(self.checkpoint, ignore_errors=True)

    def _start(self) -> None:
        """The session (its JVM writing to spark.log), then the query and the workers."""
        from redrive.spark import spark_session, start_pipeline

        log4j = self.folder / "log4j2.properties"
        log4j.write_text(LOG4J2)
        # Spark would pick the machine's first non-loopback address and warn about it.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        try:
            with _output_into(self.log_path):
                self.spark = spark_session(
                    "redrive-demo",
                    master=MASTER,
                    conf={
                        "spark.driver.extraJavaOptions": (
                            f"-Dlog4j2.configurationFile={log4j.as_uri()}"
                        )
                    },
                )
        except Exception as exc:  # noqa: BLE001 - reported by start(), in the main thread
            self._error = f"{type(exc).__name__}: {exc} (see {self.log_path})"
            self._ready.set()
            return
        finally:
            self._session_up.set()
        try:
            warming = threading.Thread(target=self._warm_up, name="spark-warm-up", daemon=True)
            warming.start()
            self.query = start_pipeline(
                self.spark,
                self.bootstrap,
                [CREATE_TOPIC, UPDATE_TOPIC],
                SparkItemHandler(self.database_url),
                policy=self.policy,
                retry_on=[ItemNotFound],
                output_topic=OUTPUT_TOPIC,
                group=SPARK_GROUP,
                requests_topic=self.requests_topic,
                per_group_topic=True,
                dead_letters="service",
                checkpoint=str(self.checkpoint),
                trigger_interval=TRIGGER,
                # A fresh checkpoint each run: start at the end of the topics, as a
                # new consumer would, not with every event of earlier runs.
                starting_offsets="latest",
                query_name="items-spark",
            )
            warming.join(self.start_timeout_s)
            self._error = self._first_batch()
        except Exception as exc:  # noqa: BLE001 - reported by wait_until_ready()
            self._error = f"the Spark query did not start: {exc} (see {self.log_path})"
        finally:
            self._ready.set()

    def _first_batch(self) -> str:
        """Wait for the query's first micro-batch; what went wrong, or ""."""
        deadline = Deadline(self.start_timeout_s)
        while not self._stopping.is_set():
            if self.query.exception() is not None:
                return f"the Spark query failed: {self.query.exception()} (see {self.log_path})"
            if self.query.lastProgress is not None:
                return ""
            if deadline.passed():
                break
            time.sleep(0.2)
        return f"the Spark query did not start in time (see {self.log_path})"

    def _warm_up(self) -> None:
        """Start Spark's Python workers (one per core) while the query starts, rather
        than when the first event arrives: on 2 busy cores that takes seconds."""
        cores = int(MASTER.removeprefix("local[").removesuffix("]"))
        with contextlib.suppress(Exception):  # only saves time: the query works without
            self.spark.range(0, cores, 1, cores).mapInArrow(warm_up, "id long").collect()

    def _halt(self) -> None:
        if self._starter is not None:
            self._starter.join(60)  # stopped while Spark started: let it get there
        if self.query is not None:
            with contextlib.suppress(Exception):
                self.query.stop()
        if self.spark is not None:
            with contextlib.suppress(Exception):
                self.spark.stop()


class SparkWatcher:
    """Narrates the Spark engine by reading what its query writes to Kafka.

    Reads the requests topic (only the records of group ``items-spark``: its retry
    requests and dead letters) and the query's output topic, from their ends when
    :meth:`start` is called, and keeps what it saw for the demo's check.
    """

    def __init__(
        self, bootstrap: str, requests_topic: str, policy: Policy, say: Callable[[str], None]
    ) -> None:
        self.bootstrap = bootstrap
        self.requests_topic = requests_topic
        self.policy = policy
        self.say = say
        self.retries: Counter[bytes | None] = Counter()
        """Retry requests of the query, by message key."""
        self.applied: list[dict[str, Any]] = []
        """What the handler applied (its output records)."""
        self.dead_letter_keys: list[bytes | None] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None

    def start(self) -> None:
        consumer = Consumer(
            with_client_logs(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": f"redrive-demo-spark-watch-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": False,
                    "fetch.wait.max.ms": 50,
                }
            )
        )
        metadata = consumer.list_topics(timeout=15)
        positions = []
        for topic in (self.requests_topic, OUTPUT_TOPIC):
            for partition in metadata.topics[topic].partitions:
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=15
                )
                positions.append(TopicPartition(topic, partition, high))
        consumer.assign(positions)
        self._consumer = consumer
        self._thread = threading.Thread(target=self._run, name="spark-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._consumer is not None:
            with contextlib.suppress(KafkaException, RuntimeError):
                self._consumer.close()

    def applied_attempt(self, item_id: str, event: str) -> int | None:
        """The attempt on which the handler applied this item's event, if it did."""
        for record in self.applied:
            if record.get("id") == item_id and record.get("event") == event:
                return int(record["attempt"])
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self._consumer.poll(0.2)
            except (KafkaException, RuntimeError):
                return
            if msg is None or msg.error() is not None:
                continue
            if msg.topic() == OUTPUT_TOPIC:
                self._on_applied(msg)
            else:
                self._on_request(msg)

    def _on_applied(self, msg: Message) -> None:
        try:
            record = json.loads(msg.value() or b"")
            event, item_id, status, attempt = (
                record["event"],
                record["id"],
                record["status"],
                record["attempt"],
            )
        except (ValueError, KeyError, TypeError):
            return
        self.applied.append(record)
        if event == CREATE_TOPIC:
            self.say(f"{event} {item_id}: created with status {status}")
        else:
            self.say(f"{event} {item_id}: status set to {status} on attempt {attempt}")

    def _on_request(self, msg: Message) -> None:
        try:
            request, _ = decode(headers_of(msg))
        except HeaderError:
            return  # not a well-formed request: not written by the query
        if request.group != SPARK_GROUP:
            return  # the App's, or anybody else's
        if request.send_to == "dlq":
            self.dead_letter_keys.append(msg.key())
            self.say(f"dead letter: {request.reason}")
            return
        self.retries[msg.key()] += 1
        delay_ms = self.policy.schedule.delay_ms(request.attempt)
        back = f" in {delay_ms / 1000:g}s" if delay_ms is not None else ""
        self.say(
            f"{request.original_topic}: {request.error_message} (attempt {request.attempt}); "
            f"the retry service brings it back{back}"
        )
