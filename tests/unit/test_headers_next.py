"""The header contract over a record's life: size caps that keep headers from growing
with attempts, the reader for redelivered messages, the request a consumer writes after
a failure (:func:`redrive.headers.next_request`) and the ids that name requests."""

from __future__ import annotations

import doctest
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redrive import headers as H
from redrive.headers import (
    ErrorInfo,
    HeaderError,
    RetryHeaders,
    cap_text,
    decode,
    describe_error,
    encode,
    next_request,
    qualified_name,
    read_delivery_headers,
    read_replay,
    read_run,
    request_id,
)

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parents[2] / "docs"

REQUIRED = [(H.DESTINATION, b"orders"), (H.RETRY_AT, b"1700000000000")]


# ---------------------------------------------------------------- caps


@given(st.text(max_size=20_000), st.integers(20, 2000), st.sampled_from(["start", "end"]))
def test_cap_text_never_exceeds_and_is_idempotent(text: str, cap: int, keep: str) -> None:
    capped = cap_text(text, cap, keep=keep)  # type: ignore[arg-type]
    assert len(capped.encode("utf-8")) <= cap
    assert cap_text(capped, cap, keep=keep) == capped  # type: ignore[arg-type]


def test_cap_keeps_start_of_message_and_end_of_trace() -> None:
    message = cap_text("é" * 2000, H.MAX_ERROR_MESSAGE_BYTES)
    assert message.startswith("éé") and message.endswith(H.TRUNCATED_SUFFIX)
    trace = cap_text("x" * 9000 + "LAST FRAME", H.MAX_ERROR_TRACE_BYTES, keep="end")
    assert trace.startswith(H.TRUNCATED_PREFIX) and trace.endswith("LAST FRAME")
    assert len(trace.encode()) == H.MAX_ERROR_TRACE_BYTES


@given(st.text(max_size=5000), st.text(max_size=20_000))
def test_error_texts_never_exceed_caps(message: str, trace: str) -> None:
    h = RetryHeaders(destination="t", retry_at=0, error_message=message, error_trace=trace)
    encoded = dict(encode(h))
    assert len(encoded[H.ERROR_MESSAGE] or b"") <= H.MAX_ERROR_MESSAGE_BYTES
    assert len(encoded[H.ERROR_TRACE] or b"") <= H.MAX_ERROR_TRACE_BYTES


def _fail(depth: int, message: str) -> BaseException:
    def recurse(n: int) -> None:
        if n == 0:
            raise RuntimeError(message)
        recurse(n - 1)

    try:
        recurse(depth)
    except RuntimeError as error:
        return error
    raise AssertionError


@settings(max_examples=30, deadline=None)
@given(st.text(max_size=3000), st.integers(0, 80))
def test_headers_do_not_grow_with_attempts(message: str, depth: int) -> None:
    user = [("trace-id", b"abc")]
    delivered: list[tuple[str, bytes | None]] = [*user]
    sizes = []
    bound = sum(
        len(n) + c
        for n, c in [
            (H.ERROR_MESSAGE, H.MAX_ERROR_MESSAGE_BYTES),
            (H.ERROR_TRACE, H.MAX_ERROR_TRACE_BYTES),
            (H.ERROR_TYPE, 30),
        ]
    )
    for attempt in range(1, 40):
        previous = read_delivery_headers(delivered)
        request = next_request(
            previous,
            destination="orders",
            retry_at=1000 * attempt,
            error=_fail(depth, message),
            record_topic="orders",
            record_partition=0,
            record_offset=attempt,
            record_timestamp=0,
        )
        assert request.attempt == attempt
        delivered = encode(request, delivered)
        assert len([n for n, _ in delivered if n == H.ATTEMPT]) == 1
        sizes.append(sum(len(n) + len(v or b"") for n, v in delivered))
        assert decode(delivered)[1] == user
    assert max(sizes) - min(sizes) <= 2  # only the attempt number's digits may grow
    assert max(sizes) <= bound + 1000


# ---------------------------------------------------------------- lenient reader


def test_read_delivery_headers_first_delivery() -> None:
    assert read_delivery_headers(None) is None
    assert read_delivery_headers([("k", b"v")]) is None


def test_read_delivery_headers_is_lenient() -> None:
    headers = [
        *REQUIRED,
        (H.ATTEMPT, b"1"),
        (H.ATTEMPT, b"4"),  # last one wins
        ("redrive-future-header", b"?"),  # ignored
        (H.PARTITION, b"x"),  # invalid optional value dropped
        (H.GROUP, b"a" * 5000),  # too long: dropped
        (H.ERROR_MESSAGE, b"m" * 5000),  # too long: capped
        (H.ORIGINAL_OFFSET, b"42"),
        (H.ID, b"not an id"),  # invalid optional value dropped
    ]
    read = read_delivery_headers(headers)
    assert read is not None
    assert (read.attempt, read.partition, read.group, read.original_offset) == (4, None, None, 42)
    assert read.id is None
    assert read.error_message is not None
    assert len(read.error_message.encode()) <= H.MAX_ERROR_MESSAGE_BYTES
    assert read_delivery_headers([(H.DESTINATION, b"bad topic"), (H.RETRY_AT, b"1")]) is None
    bad_attempt = read_delivery_headers([*REQUIRED, (H.ATTEMPT, b"0")])
    assert bad_attempt is not None and bad_attempt.attempt == 1


# ---------------------------------------------------------------- next request


class Boom(Exception):
    pass


def test_qualified_names() -> None:
    assert qualified_name(ValueError) == "ValueError"
    assert qualified_name(Boom) == f"{__name__}.Boom"
    assert qualified_name(doctest.DocTestFailure) == "doctest.DocTestFailure"


def test_describe_error() -> None:
    try:
        raise Boom("it broke")
    except Boom as error:
        info = describe_error(error)
    assert info.type == f"{__name__}.Boom"
    assert info.message == "it broke"
    assert "Traceback" in info.trace and info.trace.rstrip().endswith("Boom: it broke")


def _fail_deep(n: int) -> int:
    if n == 0:
        raise Boom("at the bottom of " + "the stack")
    return 1 + _fail_deep(n - 1)  # a call inside its line: Python would mark its columns


def test_a_trace_names_every_frame_and_cause_without_column_markers() -> None:
    try:
        try:
            _fail_deep(2)
        except Boom as cause:
            raise ValueError("while handling") from cause
    except ValueError as error:
        trace = describe_error(error).trace
    try:
        raise ExceptionGroup("several", [Boom("first"), KeyError("second")])
    except ExceptionGroup as group:
        grouped = describe_error(group).trace
    assert trace.count("in _fail_deep") == 3  # each frame, with its line of source
    assert 'raise Boom("at the bottom of " + "the stack")' in trace
    assert "The above exception was the direct cause" in trace
    assert trace.rstrip().endswith("ValueError: while handling")
    assert "Boom: first" in grouped and "KeyError: 'second'" in grouped
    for text in (trace, grouped):
        assert not [line for line in text.splitlines() if line.strip().startswith("^")]


def test_describe_error_with_broken_str() -> None:
    class Ugly(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert describe_error(Ugly()).message == "<unprintable Ugly>"


def test_next_request_first_failure() -> None:
    request = next_request(
        None,
        destination="orders.retry",
        retry_at=2000,
        deadline=9000,
        group="billing",
        error=Boom("x"),
        record_topic="orders",
        record_partition=3,
        record_offset=77,
        record_timestamp=1000,
    )
    assert request.attempt == 1
    assert (request.original_topic, request.original_partition) == ("orders", 3)
    assert (request.original_offset, request.original_timestamp) == (77, 1000)
    assert (request.error_type, request.error_message) == (f"{__name__}.Boom", "x")
    assert request.partition is None


def test_next_request_keeps_originals_and_replaces_error() -> None:
    first = next_request(
        None,
        destination="orders",
        retry_at=2000,
        deadline=9000,
        group="billing",
        error=ErrorInfo("a.First", "one", "trace one"),
        record_topic="orders",
        record_partition=3,
        record_offset=77,
        record_timestamp=1000,
    )
    second = next_request(
        first,
        destination="orders",
        retry_at=5000,
        error=("b.Second", "two", "trace two"),
        record_topic="orders.retry",
        record_partition=0,
        record_offset=5,
        record_timestamp=2000,
    )
    assert second.attempt == 2
    assert (second.original_topic, second.original_partition) == ("orders", 3)
    assert (second.original_offset, second.original_timestamp) == (77, 1000)
    assert (second.error_type, second.error_message, second.error_trace) == (
        "b.Second",
        "two",
        "trace two",
    )
    assert (second.deadline, second.group) == (9000, "billing")  # inherited
    third = next_request(second, destination="orders", retry_at=1, error=Boom(), deadline=1)
    assert third.deadline == 1


def test_next_request_caps_error_texts() -> None:
    request = next_request(None, destination="t", retry_at=0, error=("T", "m" * 5000, "t" * 50_000))
    assert decode(encode(request))[0] == request
    assert request.error_message is not None and request.error_trace is not None
    assert len(request.error_message) <= H.MAX_ERROR_MESSAGE_BYTES
    assert len(request.error_trace) <= H.MAX_ERROR_TRACE_BYTES


# ---------------------------------------------------------------- request ids


def _request(**fields: object) -> RetryHeaders:
    values: dict[str, object] = {
        "destination": "orders",
        "retry_at": 2000,
        "attempt": 2,
        "group": "billing",
        "original_topic": "orders",
        "original_partition": 3,
        "original_offset": 77,
    }
    values.update(fields)
    return RetryHeaders(**values)  # type: ignore[arg-type]


def test_request_id_is_the_same_for_the_same_failure() -> None:
    # A hand-off repeated after a crash writes the request again, later and maybe with
    # another error text or deadline: the same failure, so the same id.
    first = request_id(_request())
    assert first == request_id(
        _request(retry_at=9000, deadline=9999, error_message="other", original_timestamp=5)
    )
    assert len(first) == H.ID_LENGTH and set(first) <= set("0123456789abcdef")
    assert decode(encode(replace(_request(), id=first)))[0].id == first


@pytest.mark.parametrize(
    "change",
    [
        {"attempt": 3},  # the next retry of the record is a new request
        {"original_offset": 78},
        {"original_partition": 4},
        {"original_topic": "payments"},
        {"group": "shipping"},
        {"group": None},
    ],
)
def test_request_id_differs_for_another_failure(change: dict[str, object]) -> None:
    assert request_id(_request(**change)) != request_id(_request())


def test_a_dead_letter_has_its_failures_id_and_a_release_its_own() -> None:
    # One failure handed off as a retry before a crash and as a dead letter after it is
    # one failure; the release of a retry is another message than that retry.
    retry = _request()
    assert request_id(replace(retry, send_to="dlq", reason="spent")) == request_id(retry)
    release = replace(retry, order="release")
    assert request_id(release) != request_id(retry)
    assert request_id(release) == request_id(replace(release, retry_at=12_345))
    behind = replace(retry, attempt=0, order="behind")
    assert request_id(behind) not in (request_id(retry), request_id(release))


def test_request_id_fields_do_not_run_together() -> None:
    # A group name that contains what a naive join would put between the fields.
    a = _request(group="a.b", original_topic="c")
    b = _request(group="a", original_topic="b.c")
    assert request_id(a) != request_id(b)


def test_replace_revalidates() -> None:
    h = RetryHeaders(destination="t", retry_at=0)
    with pytest.raises(HeaderError):
        replace(h, attempt=0)


# ---------------------------------------------------------------- docs


def test_docs_examples_run() -> None:
    failures, tried = doctest.testfile(
        str(DOCS / "headers.md"), module_relative=False, optionflags=doctest.ELLIPSIS
    )
    assert tried > 0
    assert failures == 0


# ---------------------------------------------------------------- key order


@pytest.mark.parametrize("order", ["behind", "release"])
def test_a_record_not_failed_yet_has_attempt_0_only_in_a_key_queue(order: str) -> None:
    # A record behind its key's head was never handled: nothing failed, attempt 0.
    h = RetryHeaders(destination="orders", retry_at=5, attempt=0, order=order)  # type: ignore[arg-type]
    assert decode(encode(h))[0] == h
    with pytest.raises(HeaderError, match=H.ATTEMPT):
        RetryHeaders(destination="orders", retry_at=5, attempt=0)
    with pytest.raises(HeaderError, match=H.ATTEMPT):
        RetryHeaders(destination="orders", retry_at=5, attempt=0, order="key")
    with pytest.raises(HeaderError, match=H.ATTEMPT):
        decode([(H.DESTINATION, b"orders"), (H.RETRY_AT, b"5"), (H.ATTEMPT, b"0")])


def test_an_unknown_order_is_refused_and_named() -> None:
    with pytest.raises(HeaderError, match=H.ORDER):
        decode([(H.DESTINATION, b"orders"), (H.RETRY_AT, b"5"), (H.ORDER, b"partition")])
    # The lenient reader drops it, and the attempt it would have allowed.
    delivery = read_delivery_headers(
        [(H.DESTINATION, b"orders"), (H.RETRY_AT, b"5"), (H.ATTEMPT, b"0"), (H.ORDER, b"x")]
    )
    assert delivery is not None
    assert (delivery.order, delivery.attempt) == (None, 1)


def test_a_replayed_records_round_is_carried_into_its_requests_and_dead_letter() -> None:
    replayed = [("trace-id", b"t"), ("redrive-replays", b"2"), ("redrive-replay-of", b"41")]
    assert read_replay(replayed) == (2, 41)
    assert read_replay([("redrive-replays", b"2")]) is None  # both or neither
    assert read_replay([("redrive-replays", b"x"), ("redrive-replay-of", b"1")]) is None
    first = next_request(
        read_delivery_headers(replayed),  # None: a replay is a first delivery
        destination="orders",
        retry_at=5,
        error=("E", "m", "t"),
        replay=read_replay(replayed),
    )
    assert (first.replays, first.replay_of) == (2, 41)
    # Redelivered, the request's own round is copied along, as the original-* are.
    delivered = decode(encode(first))[0]
    again = next_request(delivered, destination="orders", retry_at=6, error=("E", "m", "t"))
    assert (again.attempt, again.replays, again.replay_of) == (2, 2, 41)


@given(st.lists(st.tuples(st.sampled_from(["redrive-run", "other"]), st.binary(max_size=24))))
def test_a_deliverys_run_is_read_leniently(headers: list[tuple[str, bytes]]) -> None:
    """``redrive-run`` is the last one's value when that is a decimal integer in range;
    anything else (absent, garbled, forged) is no run, and reading never raises."""
    runs = [value for name, value in headers if name == "redrive-run"]
    found = read_run(headers)
    last = runs[-1] if runs else b""
    if not last.isdigit() or len(last) > 19 or int(last) > H.MAX_INT64:
        assert found is None
    else:
        assert found == int(runs[-1])
    assert read_run([("redrive-run", b"12"), ("redrive-run", b"34")]) == 34
    assert read_run(None) is None
