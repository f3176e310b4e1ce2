"""Hypothesis strategies for the policy tests: any schedule the syntax can say."""

from __future__ import annotations

from hypothesis import strategies as st

from redrive.schedules import DelaySchedule, ExponentialBackoff, Step

H = 3_600_000

durations = st.integers(0, 30 * 24 * H)
step_schedules = st.builds(
    lambda steps, forever: DelaySchedule(
        tuple(Step(d, c) for d, c in steps[:-1])
        + (Step(steps[-1][0], None if forever else steps[-1][1]),)
    ),
    st.lists(st.tuples(durations, st.integers(1, 50)), min_size=1, max_size=6),
    st.booleans(),
)
exponentials = st.builds(
    ExponentialBackoff,
    st.integers(1, H),
    st.just(1.0) | st.floats(1.01, 100),
    st.none() | st.integers(H, 10 * H),
    st.floats(0, 1),
    st.none() | st.integers(1, 100),
)
