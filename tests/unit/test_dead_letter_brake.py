"""The dead-letter brake: its settings, the pure state machine (the sliding window
checked against a model with Hypothesis), the App's side of it (the waits it asks for,
the metrics, /healthz) and where build_steps puts it."""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from redrive import App, Breaker, DeadLetterBrake, Pause, ShareApp
from redrive.consumer.brake import PROBE_TIMEOUT_MS, BrakeMachine, BreakerState
from redrive.consumer.brakes import PROBE_RECHECK_MS, Brake, Brakes
from redrive.consumer.message import Message
from redrive.consumer.metrics import ConsumerMetrics
from redrive.consumer.metrics_server import Health
from redrive.consumer.routes import Route, build_route
from redrive.consumer.steps import Both, KeyOrders, build_steps
from redrive.consumer.strategies import Wait
from redrive.consumer.strategies.pause import Breakers
from redrive.errors import ConfigError
from redrive.headers import RetryHeaders
from redrive.policy import DeadLetter, DeadLetterReason, Retry
from redrive.router import DeadLettered, Retried

pytestmark = pytest.mark.unit

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN

# --------------------------------------------------------------------------- settings


def test_defaults_and_open_times() -> None:
    brake = DeadLetterBrake()
    assert (brake.dead_letters, brake.window_ms) == (100, 60_000)
    assert [brake.timing.open_ms(n) for n in (1, 2, 3, 5, 9)] == [
        30_000,
        60_000,
        120_000,
        480_000,
        600_000,
    ]
    assert DeadLetterBrake(window=1.5, open_for="5s, 1m").timing.open_ms(3) == 60_000
    assert str(DeadLetterBrake(dead_letters=5, window="10s", open_for="2s")) == (
        "5 dead letters in 10s, open for 2s"
    )


@pytest.mark.parametrize(
    ("options", "setting", "problem"),
    [
        ({"dead_letters": 0}, "DeadLetterBrake(dead_letters=...)", "not a whole number"),
        ({"dead_letters": 2.5}, "DeadLetterBrake(dead_letters=...)", "not a whole number"),
        ({"dead_letters": True}, "DeadLetterBrake(dead_letters=...)", "not a whole number"),
        ({"window": "a minute"}, "DeadLetterBrake(window=...)", "expected a duration"),
        ({"window": 0}, "DeadLetterBrake(window=...)", "longer than 0"),
        ({"open_for": "exponential 1s x2"}, "DeadLetterBrake(open_for=...)", "the brake could"),
        ({"open_for": "0s"}, "DeadLetterBrake(open_for=...)", "opens nothing"),
    ],
)
def test_bad_settings_say_which_and_how_to_fix_them(
    options: dict[str, Any], setting: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        DeadLetterBrake(**options)
    assert caught.value.setting == setting
    assert problem in caught.value.problem
    assert caught.value.fix


def handler(message: Message) -> None:
    pass


def test_a_handler_names_its_brake_and_only_single_record_app_handlers_take_one() -> None:
    brake = DeadLetterBrake(dead_letters=3)
    route = build_route("t", handler, "g", {"strategy": "topics", "dead_letter_brake": brake}, "1s")
    assert route.dead_letter_brake is brake
    assert build_route("t", handler, "g", {"strategy": "topics"}, "1s").dead_letter_brake is None
    with pytest.raises(ConfigError, match="not a DeadLetterBrake"):
        build_route("t", handler, "g", {"dead_letter_brake": 3}, "1s")  # type: ignore[typeddict-item]
    app = App("localhost:1", group="g")
    with pytest.raises(ConfigError, match="batch handlers have no dead-letter brake"):
        app.add_batch_handler("b", handler, strategy="topics", dead_letter_brake=brake)  # type: ignore[call-arg]
    share = ShareApp("localhost:1", group="g")
    with pytest.raises(ConfigError, match="no dead-letter brake"):
        share.add_handler("s", handler, dead_letter_brake=brake)  # type: ignore[call-arg]


# --------------------------------------------------------------------------- the machine


def test_it_opens_when_the_dead_letters_in_the_window_reach_the_threshold() -> None:
    machine = BrakeMachine(DeadLetterBrake(dead_letters=3, window="10s", open_for="5s"))
    assert machine.dead_lettered(0) is None
    assert machine.dead_lettered(4_000) is None
    # The first is out of the window at 10 s: two in it, still closed.
    assert machine.dead_lettered(10_000) is None
    opened = machine.dead_lettered(11_000)
    assert opened is not None and (opened.old, opened.new) == (CLOSED, OPEN)
    assert opened.open_until_ms == 16_000
    assert opened.why == "3 dead letters in 10s (18/min); open #1 for 5s"


def test_retries_never_count_while_closed() -> None:
    machine = BrakeMachine(DeadLetterBrake(dead_letters=1, open_for="5s"))
    for at in range(100):
        assert machine.retried(at) is None
        assert machine.handled(at) is None
    assert machine.state is CLOSED


def test_open_admits_nothing_then_one_probe_and_its_outcome_decides() -> None:
    machine = BrakeMachine(DeadLetterBrake(dead_letters=1, open_for="5s, 20s"))
    assert machine.admit(0)
    assert machine.dead_lettered(0) is not None
    assert not machine.admit(4_999)
    assert machine.tick(4_999) is None
    assert machine.dead_lettered(4_000) is None  # one taken before it opened: not counted
    half = machine.tick(5_000)
    assert half is not None and half.new is HALF_OPEN
    assert machine.admit(5_000)  # the probe
    assert not machine.admit(5_001)  # one at a time
    reopened = machine.retried(5_100)  # the probe failed and was retried: still failing
    assert reopened is not None and reopened.new is OPEN and reopened.open_until_ms == 25_100
    machine.tick(25_100)
    assert machine.admit(25_100)
    again = machine.dead_lettered(25_200)
    assert again is not None and again.why.startswith("the probe was dead-lettered; open #3")
    machine.tick(45_200)
    assert machine.admit(45_200)
    closed = machine.handled(45_300)
    assert closed is not None and (closed.old, closed.new) == (HALF_OPEN, CLOSED)
    assert machine.openings == 0 and machine.dead_letters_in_window(45_300) == 0


def test_a_probe_that_says_nothing_lets_another_go_after_the_timeout() -> None:
    machine = BrakeMachine(DeadLetterBrake(dead_letters=1, open_for="1s"))
    machine.dead_lettered(0)
    machine.tick(1_000)
    assert machine.admit(1_000)
    assert not machine.admit(1_000 + PROBE_TIMEOUT_MS - 1)
    assert machine.admit(1_000 + PROBE_TIMEOUT_MS)


Event = tuple[str, int]


@settings(max_examples=300, deadline=None)
@given(
    threshold=st.integers(1, 6),
    window_ms=st.integers(1, 5_000),
    steps=st.lists(
        st.tuples(st.sampled_from(["dead", "retried", "handled"]), st.integers(0, 2_000)),
        max_size=60,
    ),
)
def test_while_closed_it_opens_exactly_when_a_sliding_window_model_says(
    threshold: int, window_ms: int, steps: list[Event]
) -> None:
    """Dead letters only, in the window (now - window, now], since the last close."""
    machine = BrakeMachine(DeadLetterBrake(dead_letters=threshold, window=window_ms / 1000))
    now = 0
    seen: list[int] = []
    for what, gap in steps:
        now += gap
        if machine.state is not CLOSED:
            break
        if what == "dead":
            seen.append(now)
            transition = machine.dead_lettered(now)
            in_window = [at for at in seen if at > now - window_ms]
            assert (transition is not None) == (len(in_window) >= threshold)
        elif what == "retried":
            assert machine.retried(now) is None
        else:
            assert machine.handled(now) is None


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["dead", "retried", "handled", "admit", "tick"]),
            st.integers(0, 20_000),
        ),
        max_size=80,
    )
)
def test_the_states_change_only_along_the_diagram(steps: list[Event]) -> None:
    allowed = {(CLOSED, OPEN), (OPEN, HALF_OPEN), (HALF_OPEN, OPEN), (HALF_OPEN, CLOSED)}
    machine = BrakeMachine(DeadLetterBrake(dead_letters=2, window="10s", open_for="1s, 5s"))
    now = 0
    for what, gap in steps:
        now += gap
        before = machine.state
        if what == "admit":
            admitted = machine.admit(now)
            assert admitted or before is not CLOSED
            assert not (admitted and before is OPEN)
            continue
        transition = {
            "dead": machine.dead_lettered,
            "retried": machine.retried,
            "handled": machine.handled,
            "tick": machine.tick,
        }[what](now)
        if transition is None:
            assert machine.state is before
        else:
            assert (transition.old, transition.new) in allowed
            assert transition.old is before and machine.state is transition.new
            if transition.new is OPEN:
                assert transition.open_until_ms in (now + 1_000, now + 5_000)


# --------------------------------------------------------------------------- the App's side


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


def dead(reason: DeadLetterReason = DeadLetterReason.FATAL_ERROR) -> DeadLettered:
    return DeadLettered(DeadLetter(reason, "why", 1), cast(RetryHeaders, None), "orders.dlq")


def retried(at_ms: int) -> Retried:
    return Retried(Retry(at_ms=at_ms, delay_ms=1_000, attempt=1))


def route_with(brake: DeadLetterBrake | None, strategy: Any = "topics", fn: Any = handler) -> Route:
    options: dict[str, Any] = {"strategy": strategy, "dead_letter_brake": brake}
    return build_route("orders", fn, "g", cast(Any, options), "1s x3")


def test_an_open_brake_holds_each_record_until_its_open_time_then_a_probe_passes() -> None:
    clock, metrics = Clock(), ConsumerMetrics(CollectorRegistry())
    settings_ = DeadLetterBrake(dead_letters=2, window="1m", open_for="5s")
    brake = Brake(route_with(settings_), settings_, metrics, clock)
    message = cast(Message, None)
    assert brake.failed(dead(), None) is None
    assert brake.failed(retried(5_000), Wait(5_000)) == Wait(5_000)  # the route's own wait
    assert brake.state is CLOSED and brake.admit(message) is None
    assert brake.failed(dead(DeadLetterReason.ATTEMPTS_EXHAUSTED), None) is None
    assert brake.state is OPEN
    assert brake.admit(message) == Wait(6_000)  # each partition from its record on
    registry = metrics.registry
    labels = {"topic": "orders"}
    assert registry.get_sample_value("redrive_consumer_dead_letter_brake_state", labels) == 1
    assert (
        registry.get_sample_value("redrive_consumer_dead_letter_brake_openings_total", labels) == 1
    )
    clock.now = 6_000
    assert brake.admit(message) is None  # the probe
    assert brake.state is HALF_OPEN
    assert registry.get_sample_value("redrive_consumer_dead_letter_brake_state", labels) == 2
    assert brake.admit(message) == Wait(6_000 + PROBE_RECHECK_MS)
    brake.succeeded()
    assert brake.state is CLOSED and brake.admit(message) is None
    assert registry.get_sample_value("redrive_consumer_dead_letter_brake_state", labels) == 0


def test_healthz_is_degraded_not_failing_while_a_brake_is_not_closed() -> None:
    clock = Clock()
    settings_ = DeadLetterBrake(dead_letters=1, open_for="5s")
    brake = Brake(route_with(settings_), settings_, ConsumerMetrics(CollectorRegistry()), clock)
    brakes = Brakes([brake])
    healthy = Health(True, {"group": "g"})
    assert brakes.degrade(healthy).detail == {
        "group": "g",
        "dead_letter_brakes": {"orders": {"state": "closed"}},
    }
    brake.failed(dead(), None)
    verdict = brakes.degrade(healthy)
    assert verdict.ok
    assert verdict.detail["status"] == "degraded"
    assert verdict.detail["dead_letter_brakes"] == {
        "orders": {"state": "open", "open_until_ms": 6_000}
    }
    failing = Health(False, {"reason": "stalled"})
    assert brakes.degrade(failing) is failing
    assert Brakes().degrade(healthy) is healthy


def test_build_steps_adds_the_brake_only_to_routes_that_have_one() -> None:
    plain = route_with(None)
    braked = route_with(DeadLetterBrake())
    metrics = ConsumerMetrics(CollectorRegistry())
    assert not Brakes.of([plain], metrics)
    steps = build_steps([plain], KeyOrders(None, None), Breakers(), Brakes())["orders"]
    assert steps.gates == () and steps.circuit is None and steps.intake_brake is None
    brakes = Brakes.of([braked], metrics)
    steps = build_steps([braked], KeyOrders(None, None), Breakers(), brakes)["orders"]
    assert len(steps.gates) == 1 and steps.circuit is brakes.get("orders")


def test_an_async_route_in_key_order_is_braked_when_its_records_are_taken() -> None:
    async def charge(message: Message) -> None:
        pass

    route = route_with(DeadLetterBrake(), "service", charge)
    brakes = Brakes.of([route], ConsumerMetrics(CollectorRegistry()))
    steps = build_steps([route], KeyOrders(None, None), Breakers(), brakes)["orders"]
    assert steps.gates == () and steps.intake_brake is brakes.get("orders")
    in_place = route_with(DeadLetterBrake(), "blocking", charge)
    steps = build_steps([in_place], KeyOrders(None, None), Breakers(), brakes)["orders"]
    assert len(steps.gates) == 1 and steps.intake_brake is None


def test_a_pause_route_with_a_brake_tells_both_and_the_breaker_may_widen_the_wait() -> None:
    route = route_with(DeadLetterBrake(dead_letters=1), Pause(breaker=Breaker(failures=1)))
    metrics = ConsumerMetrics(CollectorRegistry())
    breakers = Breakers.of([(route.topic, route.breaker)], metrics, None)
    brakes = Brakes.of([route], metrics)
    steps = build_steps([route], KeyOrders(None, None), breakers, brakes)["orders"]
    assert isinstance(steps.circuit, Both) and len(steps.gates) == 2
    wait = steps.circuit.failed(dead(DeadLetterReason.ATTEMPTS_EXHAUSTED), None)
    assert wait is not None and wait.all_partitions  # the breaker's
    brake = brakes.get("orders")
    assert brake is not None and brake.state is OPEN


def test_each_transition_is_logged_naming_the_topic_and_the_rate() -> None:
    clock = Clock()
    settings_ = DeadLetterBrake(dead_letters=2, window="30s", open_for="5s")
    brake = Brake(route_with(settings_), settings_, ConsumerMetrics(CollectorRegistry()), clock)
    with capture_logs() as events:
        brake.failed(dead(), None)
        brake.failed(dead(), None)
        clock.now += 5_000
        brake.tick(clock.now)
        brake.admit(cast(Message, None))
        brake.succeeded()
    said = [(e["event"], e["log_level"]) for e in events]
    assert said == [
        ("dead-letter brake open", "warning"),
        ("dead-letter brake half-open", "info"),
        ("dead-letter brake closed", "info"),
    ]
    opened = events[0]
    assert opened["topic"] == "orders" and opened["open_until_ms"] == 6_000
    assert opened["why"] == "2 dead letters in 30s (4/min); open #1 for 5s"
    assert opened["holds"] == ["g.orders.retry.1s", "orders"]
