"""The pause strategy's circuit breaker: the pure state machine (property tests), its
settings, and the App's side of it (the waits it asks for, the pauses it makes)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import cast

import pytest
from confluent_kafka import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from redrive.consumer.breaker import Breaker, BreakerMachine, BreakerState, Transition
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.pauses import PauseBook
from redrive.consumer.routes import build_route
from redrive.consumer.strategies import Wait
from redrive.consumer.strategies.pause import DEFAULT_BREAKER, Circuit, Pause
from redrive.errors import ConfigError
from redrive.headers import RetryHeaders
from redrive.policy import DeadLetter, DeadLetterReason, Retry
from redrive.router import DeadLettered, Retried
from redrive.schedules import ExponentialBackoff

pytestmark = pytest.mark.unit

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN

# --------------------------------------------------------------------------- settings


def test_defaults_and_the_open_times_of_successive_openings() -> None:
    breaker = Breaker()
    assert (breaker.failures, breaker.window_ms, breaker.ratio) == (5, 30_000, None)
    assert [breaker.open_ms(n) for n in range(1, 9)] == [
        5_000,
        10_000,
        20_000,
        40_000,
        80_000,
        160_000,
        300_000,
        300_000,
    ]
    listed = Breaker(open_for="5s, 30s, 2m")
    assert [listed.open_ms(n) for n in (1, 2, 3, 4, 50)] == [5_000, 30_000, 120_000] + [120_000] * 2
    assert Breaker(open_for=[2, "1m"]).open_ms(2) == 60_000
    assert Breaker(window=1.5).window_ms == 1_500


@pytest.mark.parametrize(
    ("options", "setting", "problem"),
    [
        ({"failures": 0}, "Breaker(failures=...)", "less than 1"),
        ({"failures": 2.5}, "Breaker(failures=...)", "not a whole number"),
        ({"failures": True}, "Breaker(failures=...)", "not a whole number"),
        ({"window": "30 seconds"}, "Breaker(window=...)", "unknown unit"),
        ({"window": 0}, "Breaker(window=...)", "longer than 0"),
        ({"ratio": 0}, "Breaker(ratio=...)", "(0, 1]"),
        ({"ratio": 1.5}, "Breaker(ratio=...)", "(0, 1]"),
        ({"ratio": "half"}, "Breaker(ratio=...)", "(0, 1]"),
        ({"open_for": "5 s x"}, "Breaker(open_for=...)", "bad repeat count"),
        ({"open_for": "exponential 5s x2"}, "Breaker(open_for=...)", "no cap"),
        ({"open_for": "0s"}, "Breaker(open_for=...)", "0s opens nothing"),
    ],
)
def test_bad_settings_say_which_and_how_to_fix_them(
    options: dict[str, object], setting: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        Breaker(**options)  # type: ignore[arg-type]
    assert caught.value.setting == setting
    assert problem in caught.value.problem
    assert caught.value.fix


def test_pause_handlers_get_a_breaker_and_other_strategies_have_none() -> None:
    def handler(message: object) -> None:
        pass

    assert build_route("t", handler, "g", {"strategy": "pause"}, "1s").breaker == DEFAULT_BREAKER
    mine = Breaker(failures=2)
    chosen = build_route("t", handler, "g", {"strategy": Pause(breaker=mine)}, "1s")
    assert chosen.breaker is mine
    assert build_route("t", handler, "g", {"strategy": "blocking"}, "1s").breaker is None
    # The breaker is the pause strategy's own option: elsewhere it cannot be written
    # (mypy refuses it); an untyped caller is told where it went.
    with pytest.raises(ConfigError, match=r"strategy=Pause\(breaker=\.\.\.\)"):
        build_route("t", handler, "g", {"strategy": "blocking", "breaker": mine}, "1s")  # type: ignore[typeddict-unknown-key]
    with pytest.raises(ConfigError, match="is not a Breaker"):
        Pause(breaker=5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the machine

# An event: ("tick", advance) or ("call", advance, outcome), outcome one of
# "success", "failure" (counted) or "ignored" (a fatal error).
Event = tuple[str, int, str]
events = st.lists(
    st.tuples(
        st.sampled_from(["tick", "call", "call", "call"]),
        st.integers(min_value=0, max_value=4_000),
        st.sampled_from(["success", "failure", "failure", "ignored"]),
    ),
    max_size=120,
)
breakers = st.builds(
    Breaker,
    failures=st.integers(min_value=1, max_value=6),
    window=st.sampled_from(["1s", "5s", "30s"]),
    ratio=st.one_of(st.none(), st.sampled_from([0.25, 0.5, 0.9, 1.0])),
    open_for=st.sampled_from(
        ["2s", "1s, 3s, 10s", "exponential 1s x2 max 8s", "exponential 500ms x3 max 20s"]
    ),
)


@dataclass
class Run:
    """What a machine did with a run of events, as the App drives it: a tick each
    turn, admit before a handler unless closed, then the call's outcome."""

    breaker: Breaker
    machine: BreakerMachine
    transitions: list[tuple[int, Transition]] = field(default_factory=list)
    admitted: list[tuple[int, BreakerState]] = field(default_factory=list)
    """(time, state when admitted) of each call that ran."""
    refused: list[tuple[int, BreakerState]] = field(default_factory=list)


def drive(breaker: Breaker, steps: list[Event]) -> Run:
    machine = BreakerMachine(breaker)
    run = Run(breaker, machine)
    now = 1_000_000

    def note(transition: Transition | None) -> None:
        if transition is not None:
            run.transitions.append((now, transition))

    for kind, advance, outcome in steps:
        now += advance
        note(machine.tick(now))
        if kind == "tick":
            continue
        state = machine.state
        if state is not CLOSED and not machine.admit(now):
            run.refused.append((now, state))
            continue
        run.admitted.append((now, state))
        if outcome == "success":
            note(machine.success(now))
        elif outcome == "failure":
            note(machine.failure(now))
        else:
            machine.ignored(now)
    return run


def in_window(times: list[int], now: int, window_ms: int) -> int:
    return sum(1 for t in times if now - window_ms < t <= now)


@settings(max_examples=300, deadline=None)
@given(breakers, events)
def test_it_never_opens_from_closed_without_reaching_the_threshold(
    breaker: Breaker, steps: list[Event]
) -> None:
    machine = BreakerMachine(breaker)
    now = 1_000_000
    failures: list[int] = []
    calls: list[int] = []
    for kind, advance, outcome in steps:
        now += advance
        if machine.tick(now) is not None or kind == "tick":
            continue
        state = machine.state
        if state is not CLOSED:
            if machine.admit(now):
                transition = machine.success(now) if outcome == "success" else machine.failure(now)
                if transition is not None and transition.new is CLOSED:
                    failures.clear()
                    calls.clear()
            continue
        calls.append(now)
        if outcome == "success":
            assert machine.success(now) is None  # a success never opens it
            continue
        if outcome == "ignored":
            machine.ignored(now)
            calls.pop()  # not counted
            continue
        failures.append(now)
        transition = machine.failure(now)
        failed = in_window(failures, now, breaker.window_ms)
        called = in_window(calls, now, breaker.window_ms)
        reached = failed >= breaker.failures and (
            breaker.ratio is None or failed >= breaker.ratio * called
        )
        if transition is None:
            assert not reached, f"{failed} failures of {called} calls did not open it"
        else:
            assert (transition.old, transition.new) == (CLOSED, OPEN)
            assert reached, f"opened on {failed} failures of {called} calls"
            failures.clear()
            calls.clear()


@settings(max_examples=300, deadline=None)
@given(breakers, events)
def test_no_call_while_open_and_one_probe_at_a_time_while_half_open(
    breaker: Breaker, steps: list[Event]
) -> None:
    run = drive(breaker, steps)
    assert all(state is not OPEN for _, state in run.admitted)
    # In half-open, admit grants once; asked again before an outcome, it refuses.
    machine = run.machine
    if machine.state is HALF_OPEN:
        first = machine.admit(0)
        assert machine.admit(0) is False
        assert first or machine.probing


@settings(max_examples=300, deadline=None)
@given(breakers, events)
def test_the_states_change_only_along_the_diagram(breaker: Breaker, steps: list[Event]) -> None:
    run = drive(breaker, steps)
    allowed = {(CLOSED, OPEN), (OPEN, HALF_OPEN), (HALF_OPEN, CLOSED), (HALF_OPEN, OPEN)}
    state = CLOSED
    opened_at: int | None = None
    until: int | None = None
    for at, transition in run.transitions:
        assert transition.old is state
        assert (transition.old, transition.new) in allowed
        if transition.new is OPEN:
            assert transition.open_until_ms is not None
            opened_at, until = at, transition.open_until_ms
        if transition.new is HALF_OPEN:
            assert until is not None and opened_at is not None
            assert at >= until  # never half-open early
        state = transition.new
        assert transition.why
    assert run.machine.state is state


@settings(max_examples=300, deadline=None)
@given(breakers, events)
def test_open_times_grow_in_a_row_and_are_capped_and_a_close_starts_afresh(
    breaker: Breaker, steps: list[Event]
) -> None:
    run = drive(breaker, steps)
    in_a_row = 0
    previous = 0
    for at, transition in run.transitions:
        if transition.new is CLOSED:
            in_a_row, previous = 0, 0
        if transition.new is OPEN:
            in_a_row += 1
            assert transition.open_until_ms is not None
            lasts = transition.open_until_ms - at
            assert lasts == breaker.open_ms(in_a_row)
            assert lasts <= breaker.cap_ms()
            if isinstance(breaker.schedule, ExponentialBackoff):
                assert lasts >= previous  # exponential: never shorter than the last
            previous = lasts


def test_jitter_only_shortens_an_opening() -> None:
    breaker = Breaker(open_for="exponential 10s x2 max 1m jitter 0.5")
    rng = random.Random(7)
    for opening in range(1, 10):
        lasts = breaker.open_ms(opening, rng)
        nominal = breaker.open_ms(opening)
        assert nominal // 2 <= lasts <= nominal


def test_five_failures_in_a_row_open_it_then_a_probe_decides() -> None:
    machine = BreakerMachine(Breaker(failures=5, window="30s", open_for="2s, 4s"))
    now = 0
    for _ in range(4):
        assert machine.failure(now) is None
        now += 100
    opened = machine.failure(now)
    assert opened is not None and opened.new is OPEN and opened.open_until_ms == now + 2_000
    assert "5 failures in 30s" in opened.why and "open #1 for 2s" in opened.why
    assert not machine.admit(now + 1_999)
    assert machine.tick(now + 1_999) is None
    half = machine.tick(now + 2_000)
    assert half is not None and half.new is HALF_OPEN
    assert machine.admit(now + 2_000) and not machine.admit(now + 2_000)
    machine.ignored(now + 2_000)  # a fatal error says nothing: the next call probes
    assert machine.admit(now + 2_001)
    reopened = machine.failure(now + 2_001)
    assert reopened is not None and reopened.new is OPEN
    assert reopened.open_until_ms == now + 2_001 + 4_000  # the next, longer time
    machine.tick(now + 6_001)
    assert machine.admit(now + 6_001)
    closed = machine.success(now + 6_001)
    assert closed is not None and (closed.old, closed.new) == (HALF_OPEN, CLOSED)
    assert machine.openings == 0 and machine.failures_in_window(now + 6_001) == 0


def test_failures_out_of_the_window_do_not_count() -> None:
    machine = BreakerMachine(Breaker(failures=3, window="10s"))
    assert machine.failure(0) is None
    assert machine.failure(5_000) is None
    assert machine.failure(10_000) is None  # the first is out: (0, 10s] holds two
    assert machine.failure(14_000) is not None


def test_with_a_ratio_successes_keep_it_closed() -> None:
    machine = BreakerMachine(Breaker(failures=2, window="10s", ratio=0.5))
    machine.success(0, calls=10)
    for at in range(1, 10):
        assert machine.failure(at) is None  # 9 of 19 failed
    transition = machine.failure(10)  # 10 of 20
    assert transition is not None and "10 of 20 calls failed" in transition.why


# --------------------------------------------------------------------------- the App's side


def circuit(settings: Breaker, hooked: list[tuple[str, BreakerState, BreakerState]]) -> Circuit:
    clock = iter(range(10_000, 10_000_000, 10))
    return Circuit(
        "orders",
        settings,
        ConsumerMetrics(CollectorRegistry()),
        lambda *args: hooked.append(args),
        clock=lambda: next(clock),
    )


def retried(at_ms: int) -> Retried:
    return Retried(Retry(at_ms=at_ms, delay_ms=1_000, attempt=1))


def dead(reason: DeadLetterReason) -> DeadLettered:
    return DeadLettered(DeadLetter(reason, "why", 3), cast(RetryHeaders, None), "orders.dlq")


def test_a_failure_before_the_threshold_holds_only_its_partition() -> None:
    hooked: list[tuple[str, BreakerState, BreakerState]] = []
    c = circuit(Breaker(failures=2, open_for="5s"), hooked)
    assert c.failed(retried(50_000), Wait(50_000)) == Wait(50_000)
    widened = c.failed(retried(99_000), Wait(99_000))
    assert widened is not None and widened.all_partitions
    assert widened.all_until_ms is not None and widened.until_ms == 99_000  # its own, later
    assert widened.all_until_ms < widened.until_ms
    assert hooked == [("orders", CLOSED, OPEN)]
    state = c.metrics.registry.get_sample_value(
        "redrive_consumer_breaker_state", {"topic": "orders"}
    )
    assert state == 1


def test_fatal_dead_letters_do_not_count_spent_ones_do() -> None:
    c = circuit(Breaker(failures=1, open_for="5s"), [])
    assert c.failed(dead(DeadLetterReason.FATAL_ERROR), None) is None
    assert c.state is CLOSED
    opened = c.failed(dead(DeadLetterReason.ATTEMPTS_EXHAUSTED), None)
    assert opened is not None and opened.dealt_with and opened.all_partitions
    assert c.state is OPEN


def test_a_hook_that_raises_does_not_stop_the_breaker() -> None:
    def broken(topic: str, old: BreakerState, new: BreakerState) -> None:
        raise RuntimeError("hook bug")

    c = Circuit("orders", Breaker(failures=1), ConsumerMetrics(CollectorRegistry()), broken)
    assert c.failed(retried(1), Wait(1)) is not None
    assert c.state is OPEN


# --------------------------------------------------------------------------- PauseBook


class FakeConsumer:
    def __init__(self, assigned: list[tuple[str, int]]) -> None:
        self.assigned = list(assigned)
        self.paused: set[tuple[str, int]] = set()

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in self.assigned]

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in partitions}

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in partitions}

    def seek(self, partition: TopicPartition) -> None:
        pass


def test_partitions_assigned_while_a_breaker_holds_are_paused_at_the_next_turn() -> None:
    consumer = FakeConsumer([("t", 0), ("t", 1)])
    book = PauseBook(consumer)  # type: ignore[arg-type]
    book.wait(("t", 0), 5, 9_000)  # the failed record waits for its own retry
    book.pause_all(5_000)
    assert consumer.paused == {("t", 0), ("t", 1)}
    consumer.assigned += [("t", 2), ("t", 3)]  # a rebalance while open
    book.resume_due(4_999)
    assert consumer.paused == {("t", 0), ("t", 1), ("t", 2), ("t", 3)}
    consumer.assigned.remove(("t", 1))
    book.release({("t", 1)})  # revoked: resumed in the client
    assert ("t", 1) not in consumer.paused
    consumer.assigned.append(("t", 1))  # and back while the breaker holds: paused again
    book.resume_due(4_999)
    assert ("t", 1) in consumer.paused
    book.resume_due(5_000)  # the breaker lifts; the failed record's partition waits on
    assert consumer.paused == {("t", 0)}
    book.resume_due(9_000)
    assert consumer.paused == set()
