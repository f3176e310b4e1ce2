"""Fuzzing the two parsers that take outside input: any text either parses or is
refused with an error naming the problem; nothing else ever escapes."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redrive.headers import HeaderError, decode
from redrive.policy import Policy, PolicyError, explain, policy

pytestmark = pytest.mark.unit

schedule_alphabet = st.sampled_from(list("0123456789 .,xX*msdhSMH[]-+e{}\"'retryonialjmpxt"))
schedules = st.one_of(
    st.text(alphabet=schedule_alphabet, max_size=40),
    st.text(max_size=40),
    st.lists(
        st.one_of(st.floats(allow_nan=True), st.integers(), st.text(max_size=5)), max_size=6
    ).map(json.dumps),
    st.builds(
        lambda parts: "exponential " + " ".join(parts),
        st.lists(
            st.sampled_from(
                [
                    "1s",
                    "x2",
                    "x0.5",
                    "max",
                    "5m",
                    "jitter",
                    "0.3",
                    "retries",
                    "3",
                    "-1",
                    "1e309",
                    ",",
                ]
            ),
            max_size=8,
        ),
    ),
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=schedules,
    max_attempts=st.one_of(st.none(), st.integers(-3, 50)),
    max_duration=st.one_of(st.none(), st.sampled_from(["1h", "0s", "-5m", "x", "30"])),
)
def test_policy_text_parses_or_is_refused_clearly(
    spec: str, max_attempts: int | None, max_duration: str | None
) -> None:
    try:
        chosen = policy(spec, max_attempts=max_attempts, max_duration=max_duration)
    except PolicyError as error:
        assert str(error)  # says what is wrong
        return
    assert isinstance(chosen, Policy)
    timeline = explain(chosen)  # and a parsed policy always explains itself, finitely
    assert timeline.rows[-1].delay_ms is None


@settings(max_examples=1500, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.text(max_size=30),
                st.sampled_from(
                    [
                        "redrive-destination",
                        "redrive-retry-at",
                        "redrive-attempt",
                        "redrive-deadline",
                        "redrive-partition",
                        "redrive-send-to",
                        "redrive-reason",
                    ]
                ),
            ),
            st.one_of(st.none(), st.binary(max_size=50)),
        ),
        max_size=12,
    )
)
def test_header_decoder_decodes_or_names_the_header(
    headers: list[tuple[str, bytes | None]],
) -> None:
    try:
        request, users = decode(headers)
    except HeaderError as error:
        assert error.problem
        return
    assert request.destination and request.retry_at >= 0
    assert all(not name.startswith("redrive-") for name, _ in users)
