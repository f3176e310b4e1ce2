"""Policies: schedules and their syntax, durations, exponential back-off."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.policy_strategies import exponentials, step_schedules

from redrive.policy import (
    MAX_DELAY_MS,
    DelaySchedule,
    ExponentialBackoff,
    PolicyError,
    format_duration,
    parse_duration,
    parse_schedule,
    policy,
)

pytestmark = pytest.mark.unit

M, H, S = 60_000, 3_600_000, 1000


def delays(schedule: str | list[float], n: int = 20) -> list[int | None]:
    parsed = parse_schedule(schedule)
    return [parsed.delay_ms(i) for i in range(1, n + 1)]


def bad(spec: object, *fragments: str, position: int | None = None) -> PolicyError:
    with pytest.raises(PolicyError) as caught:
        policy(spec)  # type: ignore[arg-type]
    for fragment in fragments:
        assert fragment in str(caught.value)
    if position is not None:
        assert caught.value.position == position
    return caught.value


# ---------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("250ms", 250),
        ("5s", 5000),
        ("1.5s", 1500),
        (".5s", 500),
        ("5m", 5 * M),
        ("1h30m", 90 * M),
        ("1h 30m", 90 * M),
        (" 2d ", 2 * 24 * H),
        ("0s", 0),
    ],
)
def test_parse_duration(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (250, "250ms"),
        (5 * M, "5m"),
        (90 * M, "1h30m"),
        (1500, "1s500ms"),
        (25 * H, "1d1h"),
    ],
)
def test_format_duration(ms: int, text: str) -> None:
    assert format_duration(ms) == text


@given(st.integers(0, MAX_DELAY_MS))
def test_format_then_parse_duration(ms: int) -> None:
    assert parse_duration(format_duration(ms)) == ms


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "missing duration"),
        ("10", "missing unit after '10'"),
        ("5q", "unknown unit 'q'"),
        ("5M", "unknown unit 'M'"),
        ("5min", "unknown unit 'min'"),
        ("1.0001s", "finer than a millisecond"),
        ("99999d", "longer than"),
        ("-5s", "unexpected '-5s'"),
    ],
)
def test_bad_durations(text: str, problem: str) -> None:
    with pytest.raises(PolicyError, match=problem):
        parse_duration(text)


# ---------------------------------------------------------------- schedule syntax


def test_seed_002_schedule() -> None:
    assert delays("5m x2, 30m x3, 1h", 7) == [5 * M, 5 * M, 30 * M, 30 * M, 30 * M, H, None]


def test_schedule_whitespace_and_case() -> None:
    assert parse_schedule(" 5m X2 ,30m x 3,1h ") == parse_schedule("5m x2, 30m x3, 1h")


def test_repeat_forever() -> None:
    assert delays("1s, 1m x*", 4) == [S, M, M, M]
    assert parse_schedule("1m x*").retries is None


def test_equal_steps_are_merged() -> None:
    assert parse_schedule("5m, 5m x2") == parse_schedule("5m x3")
    assert str(parse_schedule("5m, 5m, 1h")) == "5m x2, 1h"


def test_json_list_of_seconds() -> None:
    schedule = parse_schedule("[10, 60, 300]")
    assert delays("[10, 60, 300]", 4) == [10 * S, M, 5 * M, None]
    assert str(schedule) == "10s, 1m, 5m"
    assert parse_schedule("[0.25]") == DelaySchedule.of(250)


def test_python_lists() -> None:
    assert parse_schedule([10, 60.0, "5m", timedelta(hours=1)]) == DelaySchedule.of(
        10 * S, M, 5 * M, H
    )


@pytest.mark.parametrize(
    ("spec", "fragments", "position"),
    [
        ("5m x2, 3q", ["unknown unit 'q'", "'3q'"], 7),
        ("5m x0", ["bad repeat count 'x0'"], 3),
        ("5m xx", ["bad repeat count 'xx'"], 3),
        ("5m x", ["bad repeat count 'x'"], 3),
        ("5m x*, 1h", ["only allowed on the last item"], 3),
        ("5m,", ["empty item"], 3),
        ("5m,,1h", ["empty item"], 3),
        ("10", ["missing unit"], 0),
        ("", ["empty"], None),
        ("[1,", ["not valid JSON"], 3),
    ],
)
def test_bad_schedule_strings(spec: str, fragments: list[str], position: int | None) -> None:
    error = bad(spec, f"schedule {spec!r}", *fragments, position=position)
    assert "expected" in str(error)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("[1, -2]", "item 2: -2 is not >= 0"),
        ("[1, true]", "item 2: True is not a number"),
        ('{"a": 1}', "expected a JSON list"),
        ("[]", "empty list"),
        ("[0.0001]", "finer than a millisecond"),
        ([], "empty list"),
        ([1, float("nan")], "item 2: nan"),
        ([1, "5x"], "item 2"),
    ],
)
def test_bad_lists(spec: object, fragment: str) -> None:
    bad(spec, fragment)


def test_bad_spec_type() -> None:
    bad(42, "cannot use a int")


# ---------------------------------------------------------------- exponential


def test_exponential_string() -> None:
    backoff = parse_schedule("exponential 1s x2 max 5m jitter 0.2 retries 8")
    assert backoff == ExponentialBackoff(S, 2.0, 5 * M, 0.2, 8)
    assert str(backoff) == "exponential 1s x2 max 5m jitter 0.2 retries 8"
    assert parse_schedule("exponential 1s, x 3, retries 2") == ExponentialBackoff(S, 3.0, retries=2)


def test_exponential_delays_grow_then_cap() -> None:
    backoff = ExponentialBackoff(S, 2, max_delay_ms=10 * S, retries=6)
    assert [backoff.delay_ms(n) for n in range(1, 8)] == [
        S,
        2 * S,
        4 * S,
        8 * S,
        10 * S,
        10 * S,
        None,
    ]


def test_exponential_huge_attempt_does_not_overflow() -> None:
    assert ExponentialBackoff(S, 10).delay_ms(10**9) == MAX_DELAY_MS


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("exponential", "missing initial delay"),
        ("exponential 0s", "initial delay must be > 0"),
        ("exponential 1s x0.5", "multiplier must be 1 or at least 1.01"),
        ("exponential 1s x1.001", "multiplier must be 1 or at least 1.01"),
        ("exponential 1s xabc", "x 'abc' is not a number"),
        ("exponential 1m max 1s", "must be at least the initial delay"),
        ("exponential 1s jitter 2", "jitter must be between 0 and 1"),
        ("exponential 1s retries 0", "retries must be >= 1"),
        ("exponential 1s retries two", "retries 'two' is not a whole number"),
        ("exponential 1s max", "missing value after 'max'"),
        ("exponential 1s x2 x3", "'x' given twice"),
        ("exponential 1s fast", "unknown option 'fast'"),
    ],
)
def test_bad_exponential(spec: str, fragment: str) -> None:
    bad(spec, fragment, 'expected "exponential <initial>')


@given(
    st.integers(1, 10 * M),
    st.just(1.0) | st.floats(1.01, 10),
    st.none() | st.integers(10 * M, 2 * H),
    st.floats(0, 1),
    st.integers(1, 200),
    st.integers(0, 2**32),
)
def test_exponential_never_exceeds_cap(
    initial: int, multiplier: float, cap: int | None, jitter: float, attempt: int, seed: int
) -> None:
    backoff = ExponentialBackoff(initial, multiplier, cap, jitter)
    delay = backoff.delay_ms(attempt, random.Random(seed))
    assert delay is not None
    assert 0 <= delay <= backoff.cap_ms
    assert delay <= backoff.nominal_ms(attempt)
    assert delay >= backoff.nominal_ms(attempt) * (1 - jitter) - 1


def test_jitter_is_injectable_and_deterministic() -> None:
    p = policy("exponential 10s jitter 1 retries 5")
    first = [p.decide(n, now_ms=0, rng=random.Random(7)) for n in range(1, 5)]
    again = [p.decide(n, now_ms=0, rng=random.Random(7)) for n in range(1, 5)]
    assert first == again
    seeded = policy("exponential 10s jitter 1 retries 5", rng=random.Random(7))
    assert [seeded.decide(1, now_ms=0)] == first[:1]


# ---------------------------------------------------------------- round trips


@given(step_schedules | exponentials)
def test_schedule_string_round_trip(schedule: DelaySchedule | ExponentialBackoff) -> None:
    assert parse_schedule(str(schedule)) == schedule
