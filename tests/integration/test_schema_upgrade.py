"""Upgrading a store: rows written by an older redrive read back as they were stored.

Migration 007 turns the JSON headers of every stored row into MessagePack in SQL;
the bytes it writes must be exactly those redrive packs itself (the scheduler
delivers them as they are), at every length where MessagePack changes its prefix.
"""

from __future__ import annotations

import random
from typing import Any

import psycopg
from psycopg.rows import dict_row

from redrive.header_json import headers_to_json
from redrive.service.migrations import migrate
from redrive.service.store.packed_headers import pack_headers, unpack_headers

from .service_harness import fresh_database

Headers = list[tuple[str, bytes | None]]


def _header_lists() -> list[Headers]:
    rng = random.Random(7)
    sizes = (0, 1, 15, 16, 31, 32, 255, 256, 65535, 65536)
    lists: list[Headers] = [[], [("", b""), ("", None)], [("nul\x00name", b"\x00")]]
    lists += [[("n" * size, b"\xff" * size)] for size in sizes]
    lists += [[("h", None)] * count for count in (15, 16, 65535, 65536)]
    alphabet = "aZ09-_.é€𝄞\x00\x7f"
    for _ in range(200):
        lists.append(
            [
                (
                    "".join(rng.choice(alphabet) for _ in range(rng.randrange(40))),
                    None if rng.random() < 0.2 else rng.randbytes(rng.randrange(300)),
                )
                for _ in range(rng.randrange(20))
            ]
        )
    return lists


def test_json_headers_of_an_older_store_become_the_bytes_redrive_packs(
    database_url: str,
) -> None:
    url = fresh_database(database_url)
    lists = _header_lists()
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn, up_to=6)
        with conn.transaction():
            for i, headers in enumerate(lists):
                conn.execute(
                    "INSERT INTO redrive_pending (due_ms, destination, headers, attempt,"
                    " request_topic, request_partition, request_offset)"
                    " VALUES (%s, 'd', %s::jsonb, 1, 'r', 0, %s)",
                    (i, headers_to_json(headers), i),
                )
                conn.execute(
                    "INSERT INTO redrive_dead_letters (topic, headers, reason_code, reason,"
                    " source, request_topic, request_partition, request_offset)"
                    " VALUES ('d', %s::jsonb, 'x', 'y', 'test', 'r', 0, %s)",
                    (headers_to_json(headers), i),
                )
        assert migrate(conn, up_to=7) == ["007_packed_headers"]
        for table, order in (("redrive_pending", "due_ms"), ("redrive_dead_letters", "id")):
            with conn.cursor(row_factory=dict_row) as cur:
                rows: list[dict[str, Any]] = cur.execute(
                    f"SELECT headers FROM {table} ORDER BY {order}"
                ).fetchall()
            assert len(rows) == len(lists)
            for row, headers in zip(rows, lists, strict=True):
                assert bytes(row["headers"]) == pack_headers(headers), (table, headers[:2])
                assert unpack_headers(row["headers"]) == headers
