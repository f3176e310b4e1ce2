"""Signed retry requests (redrive.signing), without a broker: a signature verifies for
the request it was made over and for nothing else, keys rotate by id, bad keys stop
start-up naming their setting, and no header makes verifying raise."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redrive.errors import ConfigError
from redrive.headers import ALL_HEADERS, SIGNATURE, RetryHeaders, decode, encode
from redrive.reasons import DeadLetterReason
from redrive.records import DeadLetterRecord, PendingRetry, RequestCoordinates
from redrive.requests import Incoming, IntakeRules, classify, identity, read_at_identity
from redrive.signing import (
    KeyRing,
    SignatureCheck,
    SigningKey,
    Verdict,
    canonical,
    key_ring,
)

pytestmark = pytest.mark.unit

NOW = 1_800_000_000_000


def secret(seed: int) -> str:
    return base64.b64encode(bytes([seed]) * 32).decode()


RING = KeyRing.from_settings([f"k1={secret(1)}"])
NEW_RING = KeyRing.from_settings([f"k2={secret(2)}", f"k1={secret(1)}"])
REQUEST = encode(
    RetryHeaders(
        destination="orders",
        retry_at=NOW,
        attempt=2,
        group="g",
        original_topic="orders",
        original_partition=0,
        original_offset=7,
        error_type="ValueError",
        error_message="boom",
    ),
    [("mine", b"\xff")],
)

redrive_names = st.sampled_from([h for h in ALL_HEADERS if h != SIGNATURE])
header_lists = st.lists(
    st.tuples(redrive_names | st.text(max_size=5), st.binary(max_size=20) | st.none()),
    max_size=8,
)
payloads = st.binary(max_size=40) | st.none()


def verdict(ring: KeyRing, headers: list, key: bytes | None, value: bytes | None) -> Verdict:
    signature = dict(headers).get(SIGNATURE)
    text = None if signature is None else signature.decode()
    return ring.verify(headers, key, value, text).verdict


@settings(max_examples=300, deadline=None)
@given(header_lists, payloads, payloads)
def test_a_signed_request_verifies_in_any_order(headers, key, value) -> None:
    signed = RING.signed(headers, key, value)
    assert verdict(RING, signed, key, value) is Verdict.VALID
    assert verdict(RING, list(reversed(signed)), key, value) is Verdict.VALID
    assert verdict(NEW_RING, signed, key, value) is Verdict.VALID  # k1 still listed


@settings(max_examples=300, deadline=None)
@given(header_lists, payloads, payloads, st.data())
def test_any_change_of_a_redrive_header_the_key_or_the_value_breaks_it(
    headers, key, value, data
) -> None:
    signed = RING.signed(headers, key, value)
    signature = signed[-1]
    body = signed[:-1]
    change = data.draw(st.sampled_from(["header", "drop", "add", "key", "value"]))
    if change == "key":
        other = data.draw(payloads.filter(lambda k: k != key))
        assert verdict(RING, signed, other, value) is Verdict.MISMATCH
        return
    if change == "value":
        other = data.draw(payloads.filter(lambda v: v != value))
        assert verdict(RING, signed, key, other) is Verdict.MISMATCH
        return
    redrive = [i for i, (n, _) in enumerate(body) if n.startswith("redrive-")]
    if change == "add" or not redrive:
        added = (data.draw(redrive_names), data.draw(st.binary(max_size=5) | st.none()))
        changed = [*body, added, signature]
    elif change == "drop":
        index = data.draw(st.sampled_from(redrive))
        changed = [*body[:index], *body[index + 1 :], signature]
    else:
        index = data.draw(st.sampled_from(redrive))
        name, raw = body[index]
        new = data.draw((st.binary(max_size=20) | st.none()).filter(lambda v: v != raw))
        changed = [*body[:index], (name, new), *body[index + 1 :], signature]
    assert verdict(RING, changed, key, value) is Verdict.MISMATCH


def test_none_and_empty_differ_for_key_value_and_header() -> None:
    assert canonical([], None, b"v") != canonical([], b"", b"v")
    assert canonical([], b"k", None) != canonical([], b"k", b"")
    assert canonical([("redrive-x", None)], None, None) != canonical(
        [("redrive-x", b"")], None, None
    )
    # length-prefixed: moving bytes between a name and its value changes the encoding
    assert canonical([("redrive-ab", b"c")], None, None) != canonical(
        [("redrive-a", b"bc")], None, None
    )


def reference_canonical(headers: list, key: bytes | None, value: bytes | None) -> bytes:
    """The encoding as docs/signing.md describes it, written plainly: netstrings, the
    redrive headers but the signature sorted, ``-`` for what is absent."""

    def field(data: bytes) -> bytes:
        return str(len(data)).encode() + b":" + data

    entries = sorted(
        field(name.encode("utf-8", "surrogatepass")) + (b"-" if raw is None else field(raw))
        for name, raw in headers
        if name.startswith("redrive-") and name != SIGNATURE
    )
    return b"".join(
        [
            b"redrive-signature-v1\n",
            str(len(entries)).encode() + b":",
            *entries,
            b"-" if key is None else field(key),
            b"-" if value is None else field(hashlib.sha256(value).digest()),
        ]
    )


long_values = st.binary(min_size=1020, max_size=1030)  # about the lengths made in advance


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            redrive_names | st.sampled_from([SIGNATURE, "redrive-x", "other"]),
            st.binary(max_size=20) | long_values | st.none(),
        ),
        max_size=8,
    ),
    payloads | long_values,
    payloads,
)
def test_the_encoding_is_the_documented_one(headers, key, value) -> None:
    assert canonical(headers, key, value) == reference_canonical(headers, key, value)


@pytest.mark.parametrize("size", [0, 1024, 1025, 8192, 8193, 20_000])
def test_the_encoding_is_the_documented_one_at_any_length(size: int) -> None:
    headers = [("redrive-error-trace", b"t" * size), ("redrive-x", b"x" * size)]
    assert canonical(headers, b"k" * size, None) == reference_canonical(headers, b"k" * size, None)


def test_signatures_of_the_first_v1_signers_still_verify() -> None:
    # Made by the first release of v1 signatures (senders and receivers of other
    # releases meet on the requests topic): the same request must sign the same.
    pinned = [
        (REQUEST, b"k", b"v", "v1:k1:XGaaW3PbFA4jiy6H5T-iWJAKF1lkc9qdKWWI5MO5kfM"),
        (
            [("redrive-x", None), ("redrive-error-trace", b"t" * 2000)],
            None,
            None,
            "v1:k1:AynKcP7yRLv006CeYzZQ1ikZDALfRpyBnMeHMZAp2yY",
        ),
        ([], b"", b"", "v1:k1:Vi-fXfjpeEpzVD3HZol-ADX2yG3WY24PFeCy8Q46ilw"),
    ]
    for headers, key, value, signature in pinned:
        assert RING.signature(headers, key, value) == signature
        assert RING.verify(headers, key, value, signature).verdict is Verdict.VALID


def test_user_headers_are_not_covered() -> None:
    signed = RING.signed(REQUEST, b"k", b"v")
    changed = [(n, b"other" if n == "mine" else v) for n, v in signed]
    assert verdict(RING, changed, b"k", b"v") is Verdict.VALID


def test_a_signature_of_another_key_or_form_does_not_verify() -> None:
    other = KeyRing.from_settings([f"k1={secret(9)}"])  # same id, another secret
    signed = other.signed(REQUEST, b"k", b"v")
    assert verdict(RING, signed, b"k", b"v") is Verdict.MISMATCH
    unknown = KeyRing.from_settings([f"k9={secret(1)}"]).signed(REQUEST, b"k", b"v")
    assert verdict(RING, unknown, b"k", b"v") is Verdict.UNKNOWN_KEY
    assert verdict(RING, REQUEST, b"k", b"v") is Verdict.UNSIGNED


@settings(deadline=None)
@given(st.text(max_size=80))
def test_a_malformed_signature_never_raises(text: str) -> None:
    result = RING.verify(REQUEST, b"k", b"v", text)
    assert result.verdict is not Verdict.VALID


def test_unreadable_headers_never_raise() -> None:
    signature = RING.signature(REQUEST, b"k", b"v")
    weird = [*REQUEST, ("redrive-x", "not bytes")]
    assert RING.verify(weird, b"k", b"v", signature).verdict is Verdict.MALFORMED  # type: ignore[arg-type]
    for odd in ([*REQUEST, (7, b"a name not a str")], None):
        assert RING.verify(odd, b"k", b"v", signature).verdict is Verdict.MALFORMED  # type: ignore[arg-type]
    # any iterable of headers reads as its list does
    assert RING.verify(iter(REQUEST), b"k", b"v", signature).verdict is Verdict.VALID


def test_the_signature_header_is_part_of_the_contract() -> None:
    signed = RING.signed(REQUEST, b"k", b"v")
    request, user = decode(signed)
    assert request.signature is not None and request.signature.startswith("v1:k1:")
    assert user == [("mine", b"\xff")]
    assert encode(request, user) == signed  # written back as it was read


def rules(check: SignatureCheck | None) -> IntakeRules:
    return IntakeRules(lambda t: True, lambda t: 1, 86_400_000, signatures=check)


def judged(headers: list, check: SignatureCheck | None, value: bytes = b"v") -> object:
    return classify(Incoming("redrive.requests", 0, 1, b"k", value, headers), rules(check), NOW)


def test_required_signatures_refuse_all_but_a_valid_one() -> None:
    required = SignatureCheck(RING, required=True)
    signed = RING.signed(REQUEST, b"k", b"v")
    accepted = judged(signed, required)
    assert isinstance(accepted, PendingRetry)
    assert accepted.headers == signed  # delivered with it: its reader verifies it too
    forged = [
        REQUEST,  # unsigned
        [*REQUEST, (SIGNATURE, b"v1:k1:AAAA")],  # a wrong one
        KeyRing.from_settings([f"k1={secret(5)}"]).signed(REQUEST, b"k", b"v"),
        RING.signed(REQUEST, b"k", b"other value"),  # the key's signature, another value
        [*REQUEST, (SIGNATURE, b"garbage")],
    ]
    for headers in forged:
        letter = judged(headers, required)
        assert isinstance(letter, DeadLetterRecord)
        assert letter.reason_code is DeadLetterReason.INVALID_SIGNATURE
        assert letter.reason.startswith("invalid signature: ")
        # Under an identity of its own: never the one the genuine request has.
        assert letter.identity == read_at_identity(RequestCoordinates("redrive.requests", 0, 1))
        assert letter.identity != accepted.identity
        assert letter.content != accepted.content


def test_a_refusal_keeps_the_id_it_claims_only_when_our_key_vouches_for_it() -> None:
    required = SignatureCheck(RING, required=True)
    allowed_nowhere = IntakeRules(lambda t: False, lambda t: 1, 86_400_000, signatures=required)
    here = Incoming("redrive.requests", 0, 1, b"k", b"v", RING.signed(REQUEST, b"k", b"v"))
    vouched = classify(here, allowed_nowhere, NOW)
    assert isinstance(vouched, DeadLetterRecord)
    assert vouched.reason_code is DeadLetterReason.DESTINATION_NOT_ALLOWED
    assert vouched.identity == identity(decode(REQUEST)[0], here.coordinates)  # a repeat: once
    unchecked = IntakeRules(lambda t: False, lambda t: 1, 86_400_000)
    unsigned = classify(Incoming("redrive.requests", 0, 1, b"k", b"v", REQUEST), unchecked, NOW)
    assert isinstance(unsigned, DeadLetterRecord)
    assert unsigned.identity == read_at_identity(here.coordinates)


def test_not_required_accepts_unsigned_and_unknown_but_not_a_mismatch_of_our_key() -> None:
    optional = SignatureCheck(RING, required=False)
    unknown = KeyRing.from_settings([f"k7={secret(7)}"]).signed(REQUEST, b"k", b"v")
    for headers in (REQUEST, unknown, RING.signed(REQUEST, b"k", b"v")):
        assert isinstance(judged(headers, optional), PendingRetry)
    letter = judged(RING.signed(REQUEST, b"k", b"v"), optional, value=b"changed")
    assert isinstance(letter, DeadLetterRecord)
    assert letter.reason_code is DeadLetterReason.INVALID_SIGNATURE
    # without keys, nothing is checked, and what came is delivered
    unchecked = judged([(SIGNATURE, b"v1:x:y"), *REQUEST], None)
    assert isinstance(unchecked, PendingRetry)
    assert unchecked.headers == [(SIGNATURE, b"v1:x:y"), *REQUEST]


def test_keys_load_from_settings_files_and_folders(tmp_path: Path) -> None:
    lines = tmp_path / "keys"
    lines.write_text(f"# rotated 2026-11\nk3={secret(3)}\n\nk4={secret(4)}\n")
    folder = tmp_path / "mounted"
    folder.mkdir()
    (folder / "k5").write_text(secret(5) + "\n")
    ring = key_ring([f"k1={secret(1)}"], [lines, folder])
    assert ring is not None and ring.ids == ("k1", "k3", "k4", "k5")
    assert ring.current.id == "k1"
    urlsafe = base64.urlsafe_b64encode(b"\xfb" * 32).decode().rstrip("=")
    assert KeyRing.from_settings([f"u={urlsafe}"]).current.secret == b"\xfb" * 32
    env = {"REDRIVE_SIGNING_KEYS": json.dumps([f"k1={secret(1)}"])}
    assert KeyRing.from_environment(env) == RING
    assert KeyRing.from_environment({}) is None


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        (["k1"], "not in the form id=secret"),
        ([f"k1={base64.b64encode(b'x' * 31).decode()}"], "at least 32"),
        (["k1=not base64!"], "not base64"),
        ([f"bad:id={secret(1)}"], "key id"),
        ([f"k1={secret(1)}", f"k1={secret(2)}"], "listed twice"),
    ],
)
def test_a_bad_key_stops_start_up_naming_the_setting(keys: list[str], problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        key_ring(keys)
    assert raised.value.setting == "signing_keys"
    assert problem in raised.value.problem
    assert secret(1) not in str(raised.value)  # a secret is never shown


def test_a_bad_key_file_names_its_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        key_ring(files=[tmp_path / "missing"])
    assert raised.value.setting == "signing_key_files"
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ConfigError, match="holds no key"):
        key_ring(files=[tmp_path / "empty"])


def test_a_key_never_shows_its_secret() -> None:
    key = SigningKey("k1", b"s" * 32)
    assert "sss" not in repr(key) and "sss" not in repr(KeyRing((key,)))


@settings(deadline=None)
@given(st.binary(min_size=32, max_size=200), st.binary(max_size=300))
def test_the_mac_is_hmac_sha256(secret_bytes: bytes, data: bytes) -> None:
    import hmac
    import pickle

    signing_key = SigningKey("k", secret_bytes)
    assert signing_key.mac(data) == hmac.digest(secret_bytes, data, "sha256")
    assert pickle.loads(pickle.dumps(signing_key)).mac(data) == signing_key.mac(data)


def test_a_sealed_id_is_deterministic_and_needs_the_current_key() -> None:
    plain = "0123456789abcdef0123456789abcdef"
    sealed = RING.sealed_id(plain)
    assert sealed == RING.sealed_id(plain) and len(sealed) == len(plain)  # a repeat has it too
    assert sealed != plain
    other = KeyRing.from_settings([f"k2={secret(2)}"])
    assert other.sealed_id(plain) != sealed  # no one without the key computes it
    rotated = KeyRing.from_settings([f"k2={secret(2)}", f"k1={secret(1)}"])
    assert rotated.sealed_id(plain) == other.sealed_id(plain)  # sealed with the current key
    assert RING.sealed_id("not hex") != RING.sealed_id("not hex!")
