"""The one exponential backoff formula, as schedules and the retry service use it.

The schedules' syntax and delays are tested through ``redrive.policy`` in
``test_policy.py``; here is :func:`redrive.schedules.backoff_delay` on its own.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redrive.schedules import ExponentialBackoff, backoff_delay

pytestmark = pytest.mark.unit

# The retry service's store backoff, as written before it called backoff_delay.
STORE_INITIAL_S = 0.2


def _written_out(attempt: int, cap: float) -> float:
    return min(STORE_INITIAL_S * 2 ** (attempt - 1), cap)


@pytest.mark.parametrize("cap", [0.05, 0.2, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0])
def test_same_as_the_store_backoff_written_out(cap: float) -> None:
    for attempt in range(1, 1000):
        assert backoff_delay(attempt, STORE_INITIAL_S, cap) == _written_out(attempt, cap)


@given(st.integers(1, 1000), st.floats(0.001, 1e6))
def test_close_to_the_formula_for_any_cap(attempt: int, cap: float) -> None:
    assert math.isclose(
        backoff_delay(attempt, STORE_INITIAL_S, cap), _written_out(attempt, cap), rel_tol=1e-12
    )


def test_doubles_from_the_initial_delay_up_to_the_cap() -> None:
    assert [backoff_delay(n, 0.2, 3.0) for n in range(1, 7)] == [0.2, 0.4, 0.8, 1.6, 3.0, 3.0]
    assert [backoff_delay(n, 1, 100, multiplier=3) for n in range(1, 6)] == [1, 3, 9, 27, 81]
    assert backoff_delay(7, 5.0, 60.0, multiplier=1) == 5.0
    assert backoff_delay(1, 5.0, 2.0) == 2.0  # a cap below the initial delay wins


def test_a_huge_attempt_is_the_cap_without_overflow() -> None:
    with pytest.raises(OverflowError):
        _written_out(5000, 10.0)  # what the formula written out did after a long outage
    assert backoff_delay(5000, STORE_INITIAL_S, 10.0) == 10.0
    assert backoff_delay(10**12, STORE_INITIAL_S, 10.0) == 10.0


@pytest.mark.parametrize(("initial", "multiplier"), [(0.0, 2.0), (-1.0, 2.0), (0.2, 0.0)])
def test_bad_arguments_are_refused(initial: float, multiplier: float) -> None:
    with pytest.raises(ValueError, match="backoff needs"):
        backoff_delay(1, initial, 10.0, multiplier)


def _nominal_ms_written_out(schedule: ExponentialBackoff, attempt: int) -> int:
    """ExponentialBackoff.nominal_ms as it was before it called backoff_delay."""
    cap, growth = schedule.cap_ms, attempt - 1
    if schedule.multiplier == 1 or growth == 0:
        return min(cap, schedule.initial_ms)
    if growth * math.log(schedule.multiplier) >= math.log(cap / schedule.initial_ms):
        return cap
    return min(cap, round(schedule.initial_ms * schedule.multiplier**growth))


@given(
    st.integers(1, 10**6),
    st.integers(1, 10**7),
    st.sampled_from([1.0, 1.01, 1.5, 2.0, 10.0]),
    st.none() | st.integers(0, 10**9),
)
def test_exponential_schedules_use_it(
    initial_ms: int, attempt: int, multiplier: float, extra_ms: int | None
) -> None:
    cap = None if extra_ms is None else initial_ms + extra_ms
    schedule = ExponentialBackoff(initial_ms, multiplier, max_delay_ms=cap)
    assert schedule.nominal_ms(attempt) == _nominal_ms_written_out(schedule, attempt)
    assert schedule.nominal_ms(attempt) == round(
        backoff_delay(attempt, initial_ms, schedule.cap_ms, multiplier)
    )
