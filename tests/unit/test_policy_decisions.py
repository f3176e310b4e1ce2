"""Policies deciding: retry or dead letter, which errors are which, the options
that bound them, and how `redrive policy explain` tells it."""

from __future__ import annotations

import doctest
import random
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tests.unit.policy_strategies import exponentials, step_schedules

from redrive.policy import (
    DeadLetter,
    DeadLetterReason,
    DelaySchedule,
    ExponentialBackoff,
    FatalError,
    Policy,
    PolicyError,
    Retry,
    RetryableError,
    Step,
    cause_chain,
    explain,
    format_explanation,
    parse_schedule,
    policy,
)

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parents[2] / "docs"
M, H, S = 60_000, 3_600_000, 1000


class NoJitter(random.Random):
    """Draws 0 every time: delays come out at their nominal (largest) value."""

    def random(self) -> float:
        return 0.0


# ---------------------------------------------------------------- decisions


def test_retry_decision() -> None:
    p = policy("5m x2, 30m")
    assert p.decide(1, now_ms=1000) == Retry(at_ms=1000 + 5 * M, delay_ms=5 * M, attempt=1)
    assert p.decide(3, now_ms=1000) == Retry(at_ms=1000 + 30 * M, delay_ms=30 * M, attempt=3)


def test_attempts_exhausted_by_schedule() -> None:
    decision = policy("5m x2, 30m").decide(4, now_ms=0)
    assert decision == DeadLetter(
        DeadLetterReason.ATTEMPTS_EXHAUSTED, "attempts exhausted (4 of 4)", 4
    )


def test_attempts_exhausted_by_max_attempts() -> None:
    p = policy("1m x*", max_attempts=3)
    assert isinstance(p.decide(2, now_ms=0), Retry)
    decision = p.decide(3, now_ms=0)
    assert isinstance(decision, DeadLetter)
    assert str(decision) == "attempts exhausted (3 of 3)"
    assert str(p.decide(9, now_ms=0)) == "attempts exhausted (9, limit 3)"
    once = policy("1m", max_attempts=1).decide(1, now_ms=0)
    assert isinstance(once, DeadLetter) and once.reason == DeadLetterReason.ATTEMPTS_EXHAUSTED


def test_deadline_from_first_failure() -> None:
    p = policy("10m x*", max_duration="30m")
    first = p.decide(1, now_ms=0)
    assert first == Retry(10 * M, 10 * M, 1, deadline_ms=30 * M)
    assert p.decide(3, now_ms=20 * M, deadline_ms=30 * M) == Retry(30 * M, 10 * M, 3, 30 * M)
    late = p.decide(4, now_ms=30 * M, deadline_ms=30 * M)
    assert isinstance(late, DeadLetter)
    assert late.reason == DeadLetterReason.DEADLINE_PASSED
    assert late.text == (
        "max duration 30m exceeded: the next retry, in 10m, would be due 10m after the deadline"
    )


def test_deadline_from_record_timestamp_seed_000() -> None:
    p = policy("10s x*", max_duration=300, deadline_from="record-timestamp")
    decision = p.decide(1, now_ms=400 * S, record_timestamp_ms=0)
    assert isinstance(decision, DeadLetter)
    assert decision.text == "max duration 5m exceeded: failed 1m40s after the deadline"
    assert p.deadline_ms(first_failure_ms=50, record_timestamp_ms=10) == 10 + 300 * S


def test_header_deadline_without_max_duration() -> None:
    decision = policy("1m x3").decide(1, now_ms=10 * M, deadline_ms=5 * M)
    assert isinstance(decision, DeadLetter)
    assert decision.text == "deadline passed: failed 5m after the deadline"


def test_earliest_deadline_wins() -> None:
    p = policy("1m x*", max_duration="1h")
    assert p.decide(1, now_ms=0, deadline_ms=10 * M) == Retry(M, M, 1, 10 * M)
    assert p.decide(1, now_ms=0, deadline_ms=10 * H) == Retry(M, M, 1, H)


def test_max_duration_forms() -> None:
    for value in ("1h", 3600, 3600.0, timedelta(hours=1)):
        assert policy("1m x*", max_duration=value).max_duration_ms == H
    with pytest.raises(PolicyError, match="negative"):
        policy("1m", max_duration=timedelta(seconds=-1))


@given(
    schedule=step_schedules | exponentials,
    attempt=st.integers(1, 500),
    now=st.integers(0, 2**45),
    since=st.integers(0, 10 * 24 * H),
    max_duration=st.none() | st.integers(0, 10 * 24 * H),
    header_deadline=st.none() | st.integers(0, 2**45),
    seed=st.integers(0, 2**32),
)
def test_retry_is_never_early_nor_after_the_deadline(
    schedule: DelaySchedule | ExponentialBackoff,
    attempt: int,
    now: int,
    since: int,
    max_duration: int | None,
    header_deadline: int | None,
    seed: int,
) -> None:
    assume(schedule.retries is not None or max_duration is not None)
    p = Policy(
        schedule, max_duration_ms=max_duration, max_attempts=None if schedule.retries else 50
    )
    decision = p.decide(
        attempt,
        now_ms=now,
        first_failure_ms=now - since,
        deadline_ms=header_deadline,
        rng=random.Random(seed),
    )
    if isinstance(decision, Retry):
        assert decision.at_ms >= now
        assert decision.at_ms == now + decision.delay_ms
        if max_duration is not None:
            assert decision.at_ms <= now - since + max_duration
        if header_deadline is not None:
            assert decision.at_ms <= header_deadline
        assert decision.attempt == attempt


def test_attempt_must_be_positive() -> None:
    with pytest.raises(ValueError, match="attempt must be an integer >= 1"):
        policy("1m").decide(0, now_ms=0)


def test_decide_uses_the_clock_by_default() -> None:
    decision = policy("1m").decide(1)
    assert isinstance(decision, Retry) and decision.at_ms > 1_600_000_000_000


# ---------------------------------------------------------------- classification


class Unavailable(Exception):
    pass


class BadPayload(ValueError):
    pass


def chained(outer: BaseException, inner: BaseException, *, explicit: bool = True) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as cause:
            if explicit:
                raise outer from cause
            raise outer  # noqa: B904  # implicit context on purpose
    except BaseException as error:
        return error
    raise AssertionError


def test_retryable_by_default() -> None:
    assert isinstance(policy("1m").decide(1, KeyError("k"), now_ms=0), Retry)


def test_fatal_on_skips_retries() -> None:
    decision = policy("1m x5", fatal_on=ValueError).decide(1, BadPayload("x"), now_ms=0)
    assert isinstance(decision, DeadLetter)
    assert decision.reason == DeadLetterReason.FATAL_ERROR
    assert decision.text == f"fatal error: {__name__}.BadPayload (matches fatal_on ValueError)"


def test_retry_on_only_retries_listed_errors() -> None:
    p = policy("1m x5", retry_on=[Unavailable, TimeoutError])
    assert isinstance(p.decide(1, TimeoutError(), now_ms=0), Retry)
    decision = p.decide(1, KeyError("k"), now_ms=0)
    assert str(decision) == "fatal error: KeyError (not in retry_on)"


def test_markers() -> None:
    p = policy("1m x5", retry_on=[Unavailable])
    assert (
        str(p.decide(1, FatalError("no"), now_ms=0))
        == "fatal error: redrive.policy.FatalError (is a FatalError)"
    )
    assert isinstance(p.decide(1, RetryableError("yes"), now_ms=0), Retry)


def test_most_specific_class_wins() -> None:
    p = policy("1m", retry_on=[ConnectionError], fatal_on=[OSError])
    assert p.classify(ConnectionRefusedError()).retryable
    assert not p.classify(FileNotFoundError()).retryable
    assert "matches fatal_on OSError" in p.classify(FileNotFoundError()).rule


def test_cause_chain_is_followed() -> None:
    p = policy("1m", fatal_on=[BadPayload])
    error = chained(RuntimeError("wrapper"), BadPayload("bad"))
    verdict = p.classify(error)
    assert not verdict.retryable and isinstance(verdict.exception, BadPayload)
    assert str(p.decide(1, error, now_ms=0)) == (
        f"fatal error: RuntimeError (its cause {__name__}.BadPayload matches fatal_on "
        f"{__name__}.BadPayload)"
    )
    implicit = chained(RuntimeError("during handling"), BadPayload("bad"), explicit=False)
    assert not p.classify(implicit).retryable


def test_suppressed_context_is_not_followed() -> None:
    try:
        try:
            raise BadPayload("bad")
        except BadPayload:
            raise RuntimeError("clean") from None
    except RuntimeError as error:
        assert [type(e) for e in cause_chain(error)] == [RuntimeError]
        assert policy("1m", fatal_on=[BadPayload]).classify(error).retryable


def test_outermost_verdict_wins() -> None:
    p = policy("1m", fatal_on=[BadPayload])
    wrapped = chained(RetryableError("try again"), BadPayload("bad"))
    assert p.classify(wrapped).retryable
    fatal_wrapper = chained(FatalError("give up"), Unavailable())
    assert not policy("1m", retry_on=[Unavailable]).classify(fatal_wrapper).retryable


def test_predicate_comes_first() -> None:
    def retryable(error: BaseException) -> bool | None:
        if isinstance(error, KeyError):
            return False
        return None

    p = policy("1m", retry_on=[KeyError, Unavailable], retryable=retryable)
    assert str(p.decide(1, KeyError("k"), now_ms=0)) == "fatal error: KeyError (fatal by predicate)"
    assert p.classify(Unavailable()).retryable


def test_fatal_beats_attempts_exhausted() -> None:
    decision = policy("1m", max_attempts=1).decide(1, FatalError(), now_ms=0)
    assert isinstance(decision, DeadLetter) and decision.reason == DeadLetterReason.FATAL_ERROR


def test_cause_chain_cycle_terminates() -> None:
    a, b = ValueError("a"), KeyError("b")
    a.__cause__, b.__cause__ = b, a
    assert list(cause_chain(a)) == [a, b]


# ---------------------------------------------------------------- policy options


@pytest.mark.parametrize(
    ("spec", "options", "fragment"),
    [
        ("1m x*", {}, "never ends: set max_attempts or max_duration"),
        ("exponential 1s", {}, "never ends"),
        ("0s x*", {"max_duration": "1h"}, "retries immediately forever"),
        ("1m", {"max_attempts": 0}, "max_attempts must be an integer >= 1"),
        ("1m", {"max_duration": -5}, "not >= 0"),
        ("1m", {"max_duration": "soon"}, "max_duration 'soon'"),
        ("1m", {"deadline_from": "now"}, "deadline_from must be"),
        (
            "1m",
            {"retry_on": [KeyError], "fatal_on": [LookupError, KeyError]},
            "KeyError is in both",
        ),
        ("1m", {"retry_on": [FatalError]}, "FatalError is in both"),
        ("1m", {"retry_on": ["KeyError"]}, "retry_on must be exception classes"),
        ("1m", {"retryable": 3}, "retryable must be a function"),
        ("1m", {"max_attemps": 3}, "unknown policy option 'max_attemps'"),
    ],
)
def test_bad_policy_options(spec: str, options: dict[str, object], fragment: str) -> None:
    with pytest.raises(PolicyError, match=fragment):
        policy(spec, **options)  # type: ignore[arg-type]


def test_policy_accepts_a_policy_and_parse_is_the_same() -> None:
    base = Policy.parse("5m x2", max_attempts=2)
    assert policy(base) is base
    changed = policy(base, max_attempts=3)
    assert changed.max_attempts == 3 and changed.schedule == base.schedule
    assert policy(parse_schedule("5m x2")) == policy("5m x2")


def test_policy_str() -> None:
    p = policy(
        "1m x*", max_attempts=5, max_duration="1h", retry_on=TimeoutError, fatal_on=[KeyError]
    )
    assert str(p) == (
        "1m x*; max attempts 5; max duration 1h from first failure; "
        "retry on TimeoutError; fatal on KeyError"
    )


# ---------------------------------------------------------------- explain


def test_explain_seed_002() -> None:
    explanation = explain("5m x2, 30m x3, 1h")
    assert [(r.attempt, r.elapsed_ms, r.delay_ms) for r in explanation.rows] == [
        (1, 0, 5 * M),
        (2, 5 * M, 5 * M),
        (3, 10 * M, 30 * M),
        (4, 40 * M, 30 * M),
        (5, 70 * M, 30 * M),
        (6, 100 * M, H),
        (7, 160 * M, None),
    ]
    assert explanation.outcome.reason == DeadLetterReason.ATTEMPTS_EXHAUSTED
    assert format_explanation(explanation) == "\n".join(
        [
            "policy: 5m x2, 30m x3, 1h",
            "attempt      at  if it fails",
            "      1     +0s  retry in 5m",
            "      2     +5m  retry in 5m",
            "      3    +10m  retry in 30m",
            "      4    +40m  retry in 30m",
            "      5  +1h10m  retry in 30m",
            "      6  +1h40m  retry in 1h",
            "      7  +2h40m  dead letter",
            "then: dead letter, attempts exhausted (7 of 7)",
            "at: time since the first failure, not counting time spent in the handler",
        ]
    )


def test_explain_start_ms_sets_absolute_times() -> None:
    rows = explain("1m, 2m", start_ms=1000).rows
    assert [r.at_ms for r in rows] == [1000, 1000 + M, 1000 + 3 * M]


def test_explain_long_timelines_are_shortened_and_fast() -> None:
    explanation = explain(policy("1s x*", max_duration="30d"), max_rows=5)
    assert len(explanation.rows) == 5
    assert explanation.rows[-1].attempt == 30 * 86_400 + 1
    assert explanation.omitted == 30 * 86_400 + 1 - 5
    text = format_explanation(explanation)
    assert f"({explanation.omitted} more attempts)" in text
    assert "then: dead letter, max duration 30d exceeded" in text


def test_explain_notes_jitter() -> None:
    text = format_explanation(explain("exponential 1s jitter 0.25 retries 3"))
    assert "jitter 0.25: each delay is drawn from 75%-100% of it" in text


@settings(max_examples=60, deadline=None)
@given(
    schedule=step_schedules | exponentials,
    max_attempts=st.none() | st.integers(1, 40),
    max_duration=st.none() | st.integers(0, 3 * 24 * H),
)
def test_explain_agrees_with_decide(
    schedule: DelaySchedule | ExponentialBackoff, max_attempts: int | None, max_duration: int | None
) -> None:
    assume(schedule.retries is not None or max_attempts is not None or max_duration is not None)
    assume(
        not (
            isinstance(schedule, DelaySchedule)
            and schedule.steps[-1] == Step(0, None)
            and max_attempts is None
        )
    )
    p = Policy(schedule, max_attempts=max_attempts, max_duration_ms=max_duration)
    explanation = explain(p, start_ms=10**12, max_rows=2000)
    assume(explanation.omitted == 0)
    now, deadline = 10**12, p.deadline_ms(first_failure_ms=10**12)
    for row in explanation.rows:
        assert row.at_ms == now
        decision = p.decide(row.attempt, now_ms=now, deadline_ms=deadline, rng=NoJitter())
        if row.delay_ms is None:
            assert decision == explanation.outcome
        else:
            assert isinstance(decision, Retry) and decision.delay_ms == row.delay_ms
            now = decision.at_ms


# ---------------------------------------------------------------- docs


def test_docs_examples_run() -> None:
    failures, tried = doctest.testfile(
        str(DOCS / "policies.md"),
        module_relative=False,
        optionflags=doctest.ELLIPSIS,
    )
    assert tried > 0
    assert failures == 0
