"""`redrive serve` keeps one requests group to one store.

Two services on two databases with the same requests topic and group would split the
partitions between them, each database getting part of the requests. The second
refuses to start, naming the settings, and the first goes on as if nothing happened.
(Services on one database sharing a group: test_service_load.py's
test_two_processes_on_one_database_share_the_work.)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from redrive.errors import ConfigError
from redrive.service import group_marks
from redrive.service.store import Store
from tests.integration.service_harness import (
    Collector,
    ServiceProcess,
    committed_metadata,
    dead_letters,
    fresh_database,
    now_ms,
    pending_count,
    produce,
    request_headers,
    running_service,
    settings_for,
    store_id,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

DOC = Path(__file__).resolve().parents[2] / "docs" / "retry-service.md"
REFUSAL = (
    "redrive: database_url, group_id, requests_topic "
    "(REDRIVE_DATABASE_URL, REDRIVE_GROUP_ID, REDRIVE_REQUESTS_TOPIC): "
)


TAKEN = "consumer group taken for this store"


def _requests(destination: str, values: list[bytes]) -> list[dict[str, object]]:
    # Keys spread the requests over the requests topic's partitions.
    due = now_ms() + 200
    return [
        {"key": value, "value": value, "headers": request_headers(destination, due)}
        for value in values
    ]


def _documented_refusal(held: str, refused: str, group: str, topic: str, log: str) -> str:
    """The refusal docs/retry-service.md shows, with this test's names and stores."""
    text = DOC.read_text().split("## One requests group, one store", 1)[1]
    shown = text.split("```console\n", 1)[1].split("```", 1)[0].split("\n", 1)[1]
    found = re.search(r"this service's database \((.*?)\) is store", log)
    assert found is not None, log[-3000:]
    for documented, actual in (
        ("c9c7a0eb77394e96879b32ef6577fdcb", store_id(held)),
        ("136de1b9fde64b909ac2fc5b00c94258", store_id(refused)),
        ("postgresql://redrive:***@db-2:5432/redrive", found.group(1)),
        ("'redrive-service'", repr(group)),
        ("redrive.requests", topic),
    ):
        assert documented in shown
        shown = shown.replace(documented, actual)
    return shown


def _exited(process: ServiceProcess) -> bool:
    return process.proc is not None and process.proc.poll() is not None


def test_each_database_is_a_store_of_its_own_kept_across_starts(database_url: str) -> None:
    first, second = fresh_database(database_url), fresh_database(database_url)
    ids = []
    for url in (first, second, first):
        store = Store(url)
        store.open()
        try:
            ids.append(store.store_id())
        finally:
            store.close()
    assert ids[0] == ids[2] != ids[1]
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_a_service_on_another_database_refuses_the_group_and_the_first_keeps_delivering(
    bootstrap: str, database_url: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    destination = new_topic("guarded")
    first_db, second_db = fresh_database(database_url), fresh_database(database_url)
    settings = settings_for(bootstrap, first_db, allowed_destinations=[destination])
    first = ServiceProcess(settings, tmp_path / "first.log")
    second = ServiceProcess(
        settings.model_copy(update={"database_url": second_db}), tmp_path / "second.log"
    )
    collector = Collector(bootstrap, destination)

    def deliver(values: list[bytes]) -> None:
        produce(bootstrap, settings.requests_topic, _requests(destination, values))
        wanted = {d.value for d in collector.received} | set(values)
        wait_until(
            lambda: {d.value for d in collector.poll_until(len(wanted), 0.2)} >= wanted,
            60,
            f"{len(values)} requests delivered by the first service",
        )

    try:
        first.start()
        deliver([f"before-{i}".encode() for i in range(12)])
        second.launch()
        wait_until(lambda: _exited(second), 90, "the second service stopped")
        # A scheduler alone reads no requests: on that database it is no one's concern.
        with running_service(
            settings.model_copy(update={"database_url": second_db, "roles": ["scheduler"]})
        ):
            pass
        deliver([f"after-{i}".encode() for i in range(12)])
        assert first.alive()
        # The second never joined the group: the first was not even rebalanced.
        first_log = first.log_path.read_text()
        assert "partitions revoked" not in first_log, (
            "the first service was rebalanced; its group events:\n"
            + "\n".join(line for line in first_log.splitlines() if "partitions" in line)
            + f"\nthe second's log:\n{second.log_path.read_text()[-3000:]}"
        )
    finally:
        collector.close()
        first_code = first.terminate() if first.proc is not None else None
        if second.proc is not None:
            second.terminate()
    assert second.proc is not None and second.proc.returncode == 2
    log = second.log_path.read_text()
    assert REFUSAL in log, log[-3000:]
    assert f"its committed offsets name store {store_id(first_db)}" in log
    assert "this service's database (postgresql://" in log
    assert f"is store {store_id(second_db)}" in log
    assert "fix: to share the work of the services on store" in log
    assert (
        _documented_refusal(first_db, second_db, settings.group_id, settings.requests_topic, log)
        in log
    )
    assert '"consumer group reads into another store; this service refuses it"' in log
    assert "Traceback" not in log
    # The second stored nothing, and the first delivered each request once.
    assert pending_count(second_db) == 0 and dead_letters(second_db) == []
    assert len(collector.received) == 24
    assert first_code == 0
    assert "refuses" not in first.log_path.read_text()


def test_a_group_an_older_redrive_committed_is_taken_from_where_it_was(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    destination = new_topic("taken")
    requests = new_topic("requests", partitions=2)
    db = fresh_database(database_url)
    settings = settings_for(
        bootstrap, db, allowed_destinations=[destination], requests_topic=requests
    )
    # An older redrive stored these and committed past them, with no metadata.
    produce(bootstrap, requests, _requests(destination, [f"old-{i}".encode() for i in range(6)]))
    older = Consumer({"bootstrap.servers": bootstrap, "group.id": settings.group_id})
    try:
        ends = [older.get_watermark_offsets(TopicPartition(requests, p), 30)[1] for p in (0, 1)]
        older.commit(
            offsets=[TopicPartition(requests, p, end) for p, end in enumerate(ends)],
            asynchronous=False,
        )
    finally:
        older.close()
    assert sum(ends) == 6
    collector = Collector(bootstrap, destination)
    try:
        with running_service(settings):
            fresh = [f"new-{i}".encode() for i in range(6)]
            produce(bootstrap, requests, _requests(destination, fresh))
            wait_until(
                lambda: len(collector.poll_until(6, 0.2)) >= 6, 60, "the new requests delivered"
            )
            delivered = {d.value for d in collector.drain(quiet_s=2)}
    finally:
        collector.close()
    assert delivered == set(fresh)  # the old ones were not read again
    mark = group_marks.settled(store_id(db))
    assert committed_metadata(bootstrap, settings.group_id, requests) == {0: mark, 1: mark}


def test_two_services_on_two_databases_starting_at_once_never_both_read_the_group(
    bootstrap: str, database_url: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    # Both may find the fresh group free at start-up: the claims made on assignment
    # let at most one of them read it (both may refuse, having stored nothing).
    destination = new_topic("race")
    dbs = [fresh_database(database_url), fresh_database(database_url)]
    settings = settings_for(bootstrap, dbs[0], allowed_destinations=[destination])
    services = [
        ServiceProcess(settings.model_copy(update={"database_url": db}), tmp_path / f"{i}.log")
        for i, db in enumerate(dbs)
    ]
    collector = Collector(bootstrap, destination)
    values = [f"r-{i}".encode() for i in range(12)]
    try:
        for service in services:
            service.launch()
        # Until one stopped, and the other stopped too or took the group (from then on
        # nothing makes it refuse).
        wait_until(
            lambda: (
                any(_exited(s) for s in services)
                and all(_exited(s) or TAKEN in s.log_path.read_text() for s in services)
            ),
            120,
            "one of the two stopped, the other took the group or stopped",
        )
        running = [i for i, s in enumerate(services) if not _exited(s)]
        if running:
            produce(bootstrap, settings.requests_topic, _requests(destination, values))
            wait_until(
                lambda: len(collector.poll_until(12, 0.2)) >= 12, 60, "the survivor delivered"
            )
            collector.drain(quiet_s=2)
            assert services[running[0]].alive()
    finally:
        collector.close()
        codes = [s.terminate() if s.proc is not None else None for s in services]
    refused = [i for i in (0, 1) if i not in running]
    for i in refused:
        log = services[i].log_path.read_text()
        assert codes[i] == 2 and REFUSAL in log, log[-3000:]
        assert "Traceback" not in log
        assert pending_count(dbs[i]) == 0 and dead_letters(dbs[i]) == []
    if running:
        assert sorted(d.value for d in collector.received) == sorted(values)
        assert codes[running[0]] == 0


def test_a_database_given_a_retired_stores_identity_takes_over_its_group(
    bootstrap: str, database_url: str, new_topic: Callable[..., str]
) -> None:
    destination = new_topic("successor")
    retired, successor = fresh_database(database_url), fresh_database(database_url)
    settings = settings_for(bootstrap, retired, allowed_destinations=[destination])
    moved = settings.model_copy(update={"database_url": successor})
    collector = Collector(bootstrap, destination)

    def deliver(value: bytes) -> None:
        produce(bootstrap, settings.requests_topic, _requests(destination, [value]))
        wait_until(
            lambda: (
                value in {d.value for d in collector.poll_until(len(collector.received) + 1, 0.2)}
            ),
            60,
            f"{value!r} delivered",
        )

    try:
        with running_service(settings):
            deliver(b"by the retired store")
        with pytest.raises(ConfigError) as refused, running_service(moved):
            pass  # not reached: start-up refuses (and leaves nothing running)
        # The fix says how, ending with the statement to run.
        fix = refused.value.fix
        statement = fix[fix.index("UPDATE redrive_store") :]
        assert statement == f"UPDATE redrive_store SET store_id = '{store_id(retired)}'"
        with psycopg.connect(successor, autocommit=True) as conn:
            conn.execute(statement.encode())
        with running_service(moved):
            deliver(b"by its successor")
    finally:
        collector.close()
    assert pending_count(successor) == 0


def test_a_copy_of_a_database_is_the_same_store_until_given_an_identity_of_its_own(
    database_url: str,
) -> None:
    original = fresh_database(database_url)
    store = Store(original)
    store.open()
    store.close()
    base, _, name = original.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}_copy" TEMPLATE "{name}"')
    copy = f"{original}_copy"
    assert store_id(copy) == store_id(original)
    with psycopg.connect(copy, autocommit=True) as conn:  # as docs/retry-service.md says
        conn.execute("UPDATE redrive_store SET store_id = gen_random_uuid()")
    assert store_id(copy) != store_id(original)


def test_a_refusal_on_assignment_stops_the_service_having_stored_nothing(
    bootstrap: str, database_url: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    # The start-up check reads the requests topic's commits; those of a topic intake
    # ingests are read when it is assigned: another store's mark there is found then.
    destination, dlt = new_topic("assigned"), new_topic("dlt")
    db = fresh_database(database_url)
    settings = settings_for(
        bootstrap, db, allowed_destinations=[destination], ingest=[{"topic": dlt}]
    )
    other = "0" * 31 + "1"
    produce(bootstrap, dlt, [{"value": b"a failed record"}])
    marker = Consumer({"bootstrap.servers": bootstrap, "group.id": settings.group_id})
    try:
        marker.commit(
            offsets=[TopicPartition(dlt, 0, 0, metadata=group_marks.settled(other))],
            asynchronous=False,
        )
    finally:
        marker.close()
    service = ServiceProcess(settings, tmp_path / "serve.log")
    try:
        service.launch()
        wait_until(lambda: _exited(service), 90, "the service stopped")
    finally:
        code = service.terminate() if service.proc is not None else None
    log = service.log_path.read_text()
    assert code == 2, log[-3000:]
    assert REFUSAL in log and f"name store {other} ({dlt} partition 0)" in log
    assert '"role": "intake"' in log  # refused by intake, once assigned
    assert "Traceback" not in log
    assert pending_count(db) == 0 and dead_letters(db) == []
