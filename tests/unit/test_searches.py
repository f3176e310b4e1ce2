"""The API's filters as the store's searches: every value a parameter, LIKE's wildcards
literal; and each kind of refused action answered with its own HTTP status."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from redrive.service.filters import DeadLetterFilter, PendingFilter
from redrive.service.operations import PendingHeld
from redrive.service.refusals import ActionRefused, Conflict, Invalid, NotAcknowledged, NotFound
from redrive.service.store.searches import dead_letters_where, pending_where
from redrive.service.web.app import status_of

pytestmark = pytest.mark.unit


def test_an_empty_search_matches_everything() -> None:
    assert dead_letters_where(DeadLetterFilter()) == ("TRUE", [])
    assert pending_where(PendingFilter()) == ("TRUE", [])


def test_every_value_is_a_parameter_and_like_wildcards_are_literal() -> None:
    since = datetime(2024, 5, 1, tzinfo=UTC)
    where, params = dead_letters_where(
        DeadLetterFilter(topic="orders'; --", text="50%_off\\", reason="r", since=since)
    )
    assert "orders" not in where and "50" not in where
    assert where.count("%s") == len(params) == 5
    assert params == ["orders'; --", "%50\\%\\_off\\\\%", "r", "%r%", since]


def test_pending_search_is_anded_in_order() -> None:
    where, params = pending_where(PendingFilter(group="g", due_before_ms=0))
    assert (where, params) == ("group_id = %s AND due_ms < %s", ["g", 0])


@pytest.mark.parametrize(
    ("refusal", "status"),
    [
        (Invalid("x"), 400),
        (NotFound("x"), 404),
        (Conflict("x"), 409),
        (PendingHeld("x"), 409),
        (NotAcknowledged("x"), 502),
    ],
)
def test_each_kind_of_refusal_has_its_status(refusal: ActionRefused, status: int) -> None:
    assert status_of(refusal) == status
