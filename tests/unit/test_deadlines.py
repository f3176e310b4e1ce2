"""Deadlines in a quiet machine's seconds: whole seconds while the load is within the
cores, stretched by the load beyond them, never more than max_stretch."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redrive.deadlines import Deadline

pytestmark = pytest.mark.unit


class Machine:
    """A clock and a load average that the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0
        self.load = 0.5

    def clock(self) -> float:
        return self.now

    def load_per_core(self) -> float:
        return self.load


def deadline(machine: Machine, seconds: float, max_stretch: float = 4.0) -> Deadline:
    return Deadline(
        seconds, max_stretch=max_stretch, clock=machine.clock, load=machine.load_per_core
    )


def test_on_a_quiet_machine_it_is_the_wall_clock() -> None:
    machine = Machine()
    d = deadline(machine, 10)
    machine.now += 9.9
    assert not d.passed()
    assert d.remaining() == pytest.approx(0.1)
    machine.now += 0.1
    assert d.passed()
    assert d.describe() == "10 s"


def test_a_loaded_machine_gets_wall_time_in_proportion_to_its_load() -> None:
    machine = Machine()
    machine.load = 2.5  # every core busy and as much again queued, and half more
    d = deadline(machine, 10)
    machine.now += 24.9
    assert not d.passed()
    machine.now += 0.1
    assert d.passed()
    assert d.describe() == "10 s (25 s of a loaded machine)"


def test_the_stretch_is_capped_so_a_hung_start_still_ends() -> None:
    machine = Machine()
    machine.load = 50.0
    d = deadline(machine, 10, max_stretch=4.0)
    machine.now += 39.9
    assert not d.passed()
    machine.now += 0.1
    assert d.passed()


def test_each_stretch_of_time_counts_at_the_load_it_had() -> None:
    machine = Machine()
    d = deadline(machine, 10)
    machine.now += 4  # quiet: 4 s
    assert not d.passed()
    machine.load = 3.0
    machine.now += 9  # loaded 3x: 3 s
    assert not d.passed()
    assert d.remaining() == pytest.approx(3)
    machine.load = 1.0
    machine.now += 3
    assert d.passed()


@given(
    seconds=st.floats(0, 1000),
    steps=st.lists(st.tuples(st.floats(0, 100), st.floats(0, 100)), max_size=30),
)
def test_it_passes_between_its_seconds_and_max_stretch_times_them(
    seconds: float, steps: list[tuple[float, float]]
) -> None:
    machine = Machine()
    d = deadline(machine, seconds)
    for dt, load in steps:
        machine.load = load
        machine.now += dt
        waited = machine.now - 100.0
        if waited < seconds * (1 - 1e-9):
            assert not d.passed()
        elif waited >= seconds * 4 * (1 + 1e-9):
            assert d.passed()


def test_a_negative_deadline_is_refused() -> None:
    with pytest.raises(ValueError, match="-1"):
        Deadline(-1)
