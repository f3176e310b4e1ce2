"""Error groups' fingerprints: the same failure whatever its ids, numbers and quoted
values; another type, other words or another application frame: another group."""

from __future__ import annotations

import re
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from redrive.service.fingerprints import FINGERPRINT_PATTERN, Failure, app_frame, group_of, mask

pytestmark = pytest.mark.unit

WORDS = st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=10)
VARIABLE = (
    st.integers(-(10**12), 10**12).map(str),
    st.uuids().map(str),
    st.integers(1, 10**9).map(lambda n: f"order-{n}"),
    st.integers(2**32, 2**64).map(lambda n: f"0x{n:x}"),
    st.binary(min_size=8, max_size=32).map(bytes.hex),
    st.text("abcdefghij 0123456789-", max_size=12).map(lambda t: f"'{t}'"),
    st.text("abcdefghij0123456789", min_size=1, max_size=8).map(lambda t: f"{t}@example.com"),
)


def failure(error_type: str | None, message: str | None, trace: str | None = None) -> Failure:
    return Failure(error_type, message, trace, "attempts_exhausted", "attempts exhausted")


@given(st.lists(WORDS, min_size=1, max_size=6), st.data())
def test_messages_differing_only_in_variable_parts_are_one_group(words, data) -> None:
    # Each place holds one kind of value (an id, a number...); the values differ.
    kinds = [data.draw(st.sampled_from(VARIABLE)) for _ in words]
    first = [w for word, kind in zip(words, kinds, strict=True) for w in (word, data.draw(kind))]
    second = [w for word, kind in zip(words, kinds, strict=True) for w in (word, data.draw(kind))]
    one = group_of(failure("billing.Timeout", " ".join(first)))
    other = group_of(failure("billing.Timeout", " ".join(second)))
    assert one == other


@given(st.lists(WORDS, min_size=1, max_size=6), st.lists(WORDS, min_size=1, max_size=6))
def test_differing_words_are_different_groups(first, second) -> None:
    if first == second:
        return
    one = group_of(failure("billing.Timeout", " ".join(first)))
    other = group_of(failure("billing.Timeout", " ".join(second)))
    assert one.fingerprint != other.fingerprint


@given(WORDS, WORDS, st.text(max_size=50))
def test_different_types_are_different_groups(a, b, message) -> None:
    if a == b:
        return
    assert group_of(failure(a, message)).fingerprint != group_of(failure(b, message)).fingerprint


@given(
    st.one_of(st.none(), st.text()),
    st.one_of(st.none(), st.text()),
    st.one_of(st.none(), st.text()),
    st.text(),
    st.one_of(st.none(), st.text()),
)
def test_never_raises_and_names_a_group(error_type, message, trace, code, reason) -> None:
    grouping = group_of(Failure(error_type, message, trace, code, reason))
    assert re.match(FINGERPRINT_PATTERN, grouping.fingerprint)
    assert "\x00" not in grouping.title and len(grouping.title) <= 200
    grouping.title.encode("utf-8")  # storable: no lone surrogate


def test_what_is_masked() -> None:
    text = (
        f"order 42 of bob@example.com (id {uuid.uuid4()}) at 0x7f3a2b "
        "hash 9f86d081884c7d65 said 'out of stock' at 2026-11-28T00:10:16Z; can't go on (char 0)"
    )
    assert mask(text) == (
        "order <n> of <email> (id <uuid>) at <hex> hash <n> said '<q>' at <n>; "
        "can't go on (char <n>)"
    )


PYTHON_TRACE = """Traceback (most recent call last):
  File "/usr/lib/python3/site-packages/redrive/consumer/pipeline.py", line 210, in run
    outcome = handler(message)
  File "/srv/app/releases/{release}/orders/handlers.py", line {line}, in handle
    price = lookup(message.value)
  File "/srv/app/releases/{release}/orders/prices.py", line {line}, in lookup
    return json.loads(raw)
  File "/usr/lib/python3.12/json/__init__.py", line 346, in loads
    return _default_decoder.decode(s)
json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)
"""

SPRING_TRACE = """org.springframework.kafka.listener.ListenerExecutionFailedException: failed
\tat org.springframework.kafka.listener.KafkaMessageListenerContainer$Listener.invoke(K.java:2)
Caused by: java.lang.IllegalStateException: order {line} has no customer
\tat java.base/java.util.Objects.requireNonNull(Objects.java:233)
\tat app//com.example.orders.OrderListener.{method}(OrderListener.java:{line})
\tat com.example.orders.Main.main(Main.java:10)
"""


def test_the_application_frame_counts_not_its_line() -> None:
    python = PYTHON_TRACE.format(release=1, line=12)
    assert app_frame(python) == "orders/prices.py:lookup"
    moved = PYTHON_TRACE.format(release=2, line=40)
    decode = "json.decoder.JSONDecodeError"
    message = "Expecting value: line 1 column 1 (char 0)"
    assert group_of(failure(decode, message, python)) == group_of(failure(decode, message, moved))
    assert app_frame(SPRING_TRACE.format(method="listen", line=42)) == (
        "com.example.orders.OrderListener.listen"
    )
    spring = "java.lang.IllegalStateException"
    here = group_of(
        failure(spring, "order 1 has no customer", SPRING_TRACE.format(method="listen", line=1))
    )
    there = group_of(
        failure(spring, "order 2 has no customer", SPRING_TRACE.format(method="other", line=1))
    )
    assert here.fingerprint != there.fingerprint  # another place in the application


def test_a_letter_without_an_error_is_grouped_by_its_reason() -> None:
    one = Failure(None, None, None, "destination_not_allowed", "destination 'a.b' is not allowed")
    two = Failure(None, None, None, "destination_not_allowed", "destination 'c' is not allowed")
    other = Failure(None, None, None, "unknown_destination", "destination 'c' is not allowed")
    assert group_of(one) == group_of(two)
    assert group_of(one).title == "destination_not_allowed: destination '<q>' is not allowed"
    assert group_of(one).fingerprint != group_of(other).fingerprint


CONNECT_TRACE = """org.apache.kafka.connect.errors.DataException: Converting failed
\tat io.confluent.connect.avro.AvroConverter.toConnectData(AvroConverter.java:{line})
\tat org.apache.kafka.connect.runtime.WorkerSinkTask.convertValue(WorkerSinkTask.java:545)
"""


def test_letters_of_other_systems_group_by_what_they_hold() -> None:
    # A Kafka Connect letter: every frame is the framework's, so type and message alone.
    connect = "org.apache.kafka.connect.errors.DataException"
    one = failure(connect, "Unknown magic byte!", CONNECT_TRACE.format(line=107))
    two = failure(connect, "Unknown magic byte!", CONNECT_TRACE.format(line=110))
    assert app_frame(one.error_trace) is None
    assert group_of(one) == group_of(two)
    # Records of a dead-letter topic without metadata: by the reason, the place masked.
    raw = "record without dead-letter metadata ingested from orders.dlq[{p}]@{o}"
    first = Failure(None, None, None, "ingested", raw.format(p=0, o=17))
    second = Failure(None, None, None, "ingested", raw.format(p=3, o=90_210))
    assert group_of(first) == group_of(second)


def test_a_message_that_is_one_quoted_value_keeps_it_so_missing_keys_are_told_apart() -> None:
    brand = group_of(failure("KeyError", "'brand'"))
    customer = group_of(failure("KeyError", "'customer_id'"))
    assert (brand.title, customer.title) == ("KeyError: 'brand'", "KeyError: 'customer_id'")
    assert brand.fingerprint != customer.fingerprint
    assert group_of(failure("KeyError", "'brand'")) == brand
    # What varies inside it is still masked: one group for every order's key.
    orders = {group_of(failure("KeyError", f"'order-{n}'")) for n in range(5)}
    assert [g.title for g in orders] == ["KeyError: '<n>'"]
    # A quoted value inside a sentence is masked as before.
    assert mask("no column 'brand' in row") == "no column '<q>' in row"
