"""Session fixtures: a real Kafka broker and a real PostgreSQL for each pytest process.

Run in parallel (`make test` runs pytest-xdist's workers), each worker has a broker
and a database server of its own: they start only if one of its tests asks for them
(unit tests stay fast), on free ports in the worker's temporary folder, so neither
another worker nor a developer's own `redrive local up` is disturbed; they are stopped
when the worker ends. How tests are spread over the workers:
tests/plugins/scheduling.py; the check that nothing outlives the run:
tests/plugins/leftovers.py.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from redrive.local import LocalStack, StackPorts, StackStatus
from redrive.local.kafka import LocalKafka

pytest_plugins = [
    "tests.plugins.scheduling",
    "tests.plugins.leftovers",
    "tests.plugins.cpu_report",
    "tests.integration.local_stack_harness",
]

# The tests' Spark JVMs (local sessions, spark-submit, the demo) read their defaults
# from here: see the file for why.
os.environ["SPARK_CONF_DIR"] = str(Path(__file__).resolve().parent / "spark-conf")


SHARE_HEARTBEAT_MS = "1000"
"""How often the session broker has share-group members heartbeat. Kafka's default is
5 s, also the least a group may ask for unless the broker lowers it. A member is given
its partitions in a heartbeat's answer, so each share consumer a test started waited
up to that long for its first record; the tests' assertions do not depend on the
interval (each waits for outcomes with a deadline)."""


class SuiteStack(LocalStack):
    """The local stack, its broker with the suite's share-group heartbeat."""

    def kafka(self, ports: StackPorts | None = None) -> LocalKafka:
        broker = super().kafka(ports)
        broker.extra_properties.update(
            {
                "group.share.heartbeat.interval.ms": SHARE_HEARTBEAT_MS,
                "group.share.min.heartbeat.interval.ms": SHARE_HEARTBEAT_MS,
            }
        )
        return broker


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = SuiteStack(tmp_path_factory.mktemp("redrive-state"))
    try:
        stack.up(kafka_port=0, postgres_port=0, quiet=True)
        yield stack
    finally:
        stack.down()


@pytest.fixture(scope="session")
def stack_status(local_stack: LocalStack) -> StackStatus:
    return local_stack.status()


@pytest.fixture(scope="session")
def bootstrap(stack_status: StackStatus) -> str:
    return stack_status.bootstrap


@pytest.fixture(scope="session")
def database_url(stack_status: StackStatus) -> str:
    return stack_status.database_url


@pytest.fixture
def new_topic(bootstrap: str) -> Callable[..., str]:
    """Create a topic with a unique name (and wait until it exists); returns its name."""

    def create(prefix: str = "t", partitions: int = 1) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        futures = admin.create_topics([NewTopic(name, num_partitions=partitions)])
        futures[name].result(timeout=30)
        wait_for_topics(admin, [name])
        return name

    return create


@pytest.fixture(scope="session")
def output_dir() -> Path:
    """Artifacts that tests leave for people to look at (screenshots, reports)."""
    path = Path(__file__).resolve().parent.parent / "test-output"
    path.mkdir(exist_ok=True)
    return path


def wait_for_topics(admin: AdminClient, names: list[str], timeout_s: float = 30) -> None:
    """Return once the broker's metadata shows each topic with its partitions.

    A created topic reaches the broker's metadata a moment after the controller
    answers; a service that looked in that moment (and caches what it saw for a second)
    would dead-letter requests to it as unknown_destination.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        topics = admin.list_topics(timeout=10).topics
        if all(n in topics and topics[n].error is None and topics[n].partitions for n in names):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"topics {names} not in the broker's metadata")
        time.sleep(0.05)
