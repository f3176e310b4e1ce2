"""A record's size as a broker judges it: the cheap bound is never below the exact size
(which tests/integration/test_record_size.py checks against a real broker)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redrive.sizes import single_record_batch_size, single_record_batch_size_at_most

pytestmark = pytest.mark.unit

data = st.none() | st.binary(max_size=300)
headers = st.lists(st.tuples(st.text(max_size=40), data), max_size=12)


@given(data, data, headers)
def test_the_bound_is_never_below_the_exact_size(
    key: bytes | None, value: bytes | None, pairs: list[tuple[str, bytes | None]]
) -> None:
    assert single_record_batch_size_at_most(key, value, pairs) >= single_record_batch_size(
        key, value, pairs
    )


@given(st.integers(0, 2_000_000))
def test_large_values_are_bounded_too(length: int) -> None:
    value = b"v" * length
    exact = single_record_batch_size(b"key", value, [("redrive-attempt", b"3")])
    assert exact <= single_record_batch_size_at_most(b"key", value, [("redrive-attempt", b"3")])
    assert exact > length
