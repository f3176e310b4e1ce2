"""Headers at rest in the service's store come back byte for byte, whatever a Kafka
producer wrote (names that are not UTF-8 arrive from confluent-kafka as text with
surrogates; NULs, empty and absent values, duplicates, order)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from redrive.service.store.packed_headers import pack_headers, unpack_headers

names = st.text() | st.binary().map(lambda b: b.decode("utf-8", "surrogateescape"))
header_lists = st.lists(st.tuples(names, st.none() | st.binary()), max_size=40)


@given(header_lists)
def test_headers_come_back_byte_for_byte(headers: list[tuple[str, bytes | None]]) -> None:
    stored = pack_headers(headers)
    assert unpack_headers(stored) == headers
    assert unpack_headers(memoryview(stored)) == headers  # as psycopg may hand it over


def test_lengths_at_every_prefix_boundary() -> None:
    # MessagePack changes its length prefix at these sizes (fix, 8, 16 and 32 bits).
    for size in (0, 15, 16, 31, 32, 255, 256, 65535, 65536):
        headers = [("n" * size, b"v" * size), ("x", None)] + [("h", b"")] * size
        assert unpack_headers(pack_headers(headers)) == headers
