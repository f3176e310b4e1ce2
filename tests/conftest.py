"""Session fixtures: one real Kafka broker and one real PostgreSQL for the whole run.

They start only if a test asks for them (unit tests stay fast), on free ports in a
temporary state folder, so a developer's own `redrive local up` is left alone; they
are stopped at the end of the run.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from redrive.local import LocalStack, StackStatus


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = LocalStack(tmp_path_factory.mktemp("redrive-state"))
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
