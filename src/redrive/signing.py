"""Signed retry requests: an HMAC-SHA256 over what a request asks, named by a key id.

Anyone who may write to the requests topic may ask the retry service to deliver any
key and value to any allowed destination. A sender holding a key signs each request
it writes there (``redrive-signature: v1:<key id>:<MAC>``, :data:`SIGNATURE`); a
receiver told to require signatures (:class:`SignatureCheck`, given to
:func:`redrive.requests.classify` through its rules) refuses what does not verify.

Invariant: a signature verifies for exactly the request it was made over: the same
set of redrive contract headers other than the signature (names and values, in any
order), the same record key and the same value (by its SHA-256), under a key of this
process's own :class:`KeyRing`, which comes from settings or files, never from a
topic. The encoding MACed (:func:`canonical`) is length-prefixed and tags an absent
key or value apart from an empty one, so no two different requests encode alike.
Verifying never raises, whatever the header holds.

Keys rotate: a ring signs with its first key and verifies with any it lists, by id.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Final

from redrive.errors import ConfigError
from redrive.header_fields import (
    FIELD_OF,
    MAX_ERROR_TRACE_BYTES,
    MAX_VALUE_BYTES,
    SIGNATURE,
    Header,
    is_redrive_header,
)

VERSION: Final = "v1"
"""The form of the signature this module writes and reads: ``v1:<key id>:<MAC>``."""
MIN_SECRET_BYTES: Final = 32
"""The shortest secret accepted, in bytes once decoded: SHA-256's block of strength."""
KEY_ID_PATTERN: Final = r"[A-Za-z0-9._-]{1,64}"
_KEY_ID_RE: Final = re.compile(KEY_ID_PATTERN)
_DOMAIN: Final = b"redrive-signature-v1\n"
"""The encoding's first bytes: a MAC of this form is never one of another."""


def _heads_of_lengths(most: int) -> tuple[bytes, ...]:
    """The heads of fields of 0 to ``most`` bytes, each at its length's index."""
    return tuple(b"%d:" % length for length in range(most + 1))


_LENGTHS = _heads_of_lengths(MAX_VALUE_BYTES)
"""``_LENGTHS[n] == b"<n>:"``, the head of a field of n bytes (formatting bytes costs
as much as the rest of a header's encoding), made once: up to the contract's cap on
most values, and up to its largest cap (an error trace's) from the first time a
longer field is met."""


def _length(length: int) -> bytes:
    """The head of a field of ``length`` bytes, ``b"<length>:"``."""
    global _LENGTHS
    lengths = _LENGTHS
    if length < len(lengths):
        return lengths[length]
    if length <= MAX_ERROR_TRACE_BYTES:
        # Rebound whole, so a thread reading the table meanwhile reads the old one.
        _LENGTHS = lengths = _heads_of_lengths(MAX_ERROR_TRACE_BYTES)
        return lengths[length]
    return b"%d:" % length


def _field(data: bytes) -> bytes:
    """One field as a netstring's head and body, ``<length>:<bytes>``: self-delimiting,
    so a sequence of them reads back one way only."""
    return _length(len(data)) + data


_DIGEST_HEAD: Final = _length(hashlib.sha256().digest_size)
_ABSENT: Final = b"-"
"""An absent key, value or header value: no field starts with it, so it is told apart
from an empty one (``0:``)."""

_HEADS: Final[dict[str, bytes | None]] = {name: _field(name.encode()) for name in FIELD_OF}
"""Header name -> its field, None for a header the MAC leaves out (the signature, the
user's headers): the contract's names, and up to :data:`_KEPT_NAMES` others as they
are met (:func:`_head`; not all: anyone may write any name)."""
_HEADS[SIGNATURE] = None
_KEPT_NAMES: Final = 1024
_KEPT_NAME_LENGTH: Final = 128


def _head(name: str) -> bytes | None:
    """:data:`_HEADS`' answer for any name, learnt if there is room (a name not kept
    costs its request a second pass of :func:`canonical`, nothing more)."""
    if name in _HEADS:
        return _HEADS[name]
    if type(name) is not str:
        raise TypeError(f"a header name is a str, not {type(name).__name__}")
    if name == SIGNATURE or not is_redrive_header(name):
        head = None
    else:
        head = _field(name.encode("utf-8", "surrogatepass"))
    if len(_HEADS) < _KEPT_NAMES and len(name) <= _KEPT_NAME_LENGTH:
        _HEADS[name] = head  # the same for every thread that learns it
    return head


def canonical(
    headers: Iterable[Header],
    key: bytes | None,
    value: bytes | None,
    *,
    value_digest: bytes | None = None,
) -> bytes:
    """What a signature is a MAC of: each redrive header but the signature (name and
    value, sorted, so their order does not matter), the key, and the value's SHA-256
    (``value_digest``, when the caller has it already: :func:`value_digest`).

    Raises TypeError for a header value that is not bytes (the sender's mistake);
    :meth:`KeyRing.verify` reads a refusal into it instead.
    """
    if type(headers) is not list:
        headers = list(headers)  # read twice below, if need be
    try:
        # Every request the service reads comes through here, as few steps as can be:
        # the usual one has only names met before, and values of bytes whose lengths'
        # heads are made (the contract caps them).
        lengths = _LENGTHS
        entries = [
            head + lengths[len(raw)] + raw  # type: ignore[arg-type, operator]  # None: below
            for name, raw in headers
            if (head := _HEADS[name]) is not None
        ]
    except (KeyError, IndexError, TypeError):
        # Any other, a header at a time: a name not met before (learnt), a longer value
        # (its head made), a null one; a value that is not bytes raises TypeError again.
        entries = [
            head + (_ABSENT if raw is None else _field(raw))
            for name, raw in headers
            if (head := _head(name)) is not None
        ]
    # A netstring is prefix-free, so sorting the entries' bytes sorts them by their
    # names' fields, then (a name given twice) by value: the headers' order drops out.
    entries.sort()
    return b"".join(
        (
            _DOMAIN,
            _length(len(entries)),
            *entries,
            _ABSENT if key is None else _field(key),
            _ABSENT
            if value is None
            else _DIGEST_HEAD + (value_digest or hashlib.sha256(value).digest()),
        )
    )


def value_digest(value: bytes | None) -> bytes | None:
    """The SHA-256 of a record's value (None: it has none), as :func:`canonical` MACs it:
    computed once by a receiver that also keeps what a request carries."""
    return None if value is None else hashlib.sha256(value).digest()


def _text(mac: bytes) -> bytes:
    """A MAC as the signature writes it: URL-safe base64 without padding."""
    return binascii.b2a_base64(mac, newline=False).translate(_URL_SAFE).rstrip(b"=")


_URL_SAFE: Final = bytes.maketrans(b"+/", b"-_")


@dataclass(frozen=True)
class SigningKey:
    """One secret and the id that names it in signatures (never in logs: see repr)."""

    id: str
    secret: bytes = field(repr=False)
    _pads: tuple[Any, Any] = field(init=False, repr=False, compare=False)
    """HMAC's inner and outer hashes with the key's pads already absorbed (RFC 2104),
    copied for each MAC: the key is not hashed again for every request."""
    identity_key: bytes = field(init=False, repr=False, compare=False)
    """The key of the ids this key's holder seals (:meth:`KeyRing.sealed_id`), derived
    from the secret so that an id never reveals a MAC made with it."""

    def __post_init__(self) -> None:
        if _KEY_ID_RE.fullmatch(self.id) is None:
            raise ValueError(
                f"key id {self.id[:70]!r} is not 1 to 64 characters of A-Z a-z 0-9 . _ -"
            )
        if len(self.secret) < MIN_SECRET_BYTES:
            raise ValueError(
                f"the secret of key {self.id!r} has {len(self.secret)} bytes; at least "
                f"{MIN_SECRET_BYTES} are needed (e.g. openssl rand -base64 32)"
            )
        block = self.secret
        if len(block) > _BLOCK:  # HMAC hashes a key longer than the hash's block
            block = hashlib.sha256(block).digest()
        block = block.ljust(_BLOCK, b"\0")
        inner = hashlib.sha256(block.translate(_IPAD))
        outer = hashlib.sha256(block.translate(_OPAD))
        object.__setattr__(self, "_pads", (inner, outer))
        object.__setattr__(self, "identity_key", self.mac(_IDENTITY_DOMAIN))

    def __reduce__(self) -> tuple[Any, ...]:
        # Hash objects do not pickle (Spark ships the keys to its executors).
        return (SigningKey, (self.id, self.secret))

    def mac(self, data: bytes) -> bytes:
        """HMAC-SHA256 of ``data`` with this key (``hmac.digest(secret, data, "sha256")``)."""
        inner_pad, outer_pad = self._pads
        inner = inner_pad.copy()
        inner.update(data)
        outer = outer_pad.copy()
        outer.update(inner.digest())
        mac: bytes = outer.digest()
        return mac


_BLOCK: Final = 64
_IDENTITY_DOMAIN: Final = b"redrive-identity-v1"
_ID_BYTES: Final = 16
"""A ``redrive-id``'s length in bytes (32 hex characters)."""
"""SHA-256's block size, in bytes."""
_IPAD: Final = bytes(byte ^ 0x36 for byte in range(256))
_OPAD: Final = bytes(byte ^ 0x5C for byte in range(256))


class Verdict(Enum):
    """What :meth:`KeyRing.verify` found."""

    VALID = "valid"
    UNSIGNED = "unsigned"
    MALFORMED = "malformed"
    UNKNOWN_KEY = "unknown key"
    MISMATCH = "mismatch"


@dataclass(frozen=True, slots=True)
class Verification:
    verdict: Verdict
    problem: str
    """Why it did not verify, for a dead letter's reason ("" when valid)."""


_VALID: Final = Verification(Verdict.VALID, "")
_UNSIGNED: Final = Verification(Verdict.UNSIGNED, "the request is not signed")


@dataclass(frozen=True, slots=True)
class KeyRing:
    """The keys a process signs and verifies with: it signs with the first, and
    verifies a signature with the key its id names, if listed."""

    keys: tuple[SigningKey, ...]
    _by_id: Mapping[str, SigningKey] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("a key ring needs at least one key")
        by_id: dict[str, SigningKey] = {}
        for key in self.keys:
            if key.id in by_id:
                raise ValueError(f"key id {key.id!r} is listed twice")
            by_id[key.id] = key
        object.__setattr__(self, "_by_id", by_id)

    @classmethod
    def from_settings(cls, keys: Iterable[str] = (), files: Iterable[str | Path] = ()) -> KeyRing:
        """The ring of ``id=secret`` values (secrets in base64) and key files (see
        :func:`read_key_file`), the first key signing; a ConfigError when a key is bad
        or none is given."""
        ring = key_ring(keys, files)
        if ring is None:
            raise ConfigError("signing", "no signing key given", "give keys or key files")
        return ring

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> KeyRing | None:
        """The ring of ``REDRIVE_SIGNING_KEYS`` and ``REDRIVE_SIGNING_KEY_FILES`` (JSON
        lists, as the retry service reads them), None when neither is set."""
        given = [_json_list(environ, name) for name in (ENV_KEYS, ENV_KEY_FILES)]
        return key_ring(given[0], given[1], setting=ENV_KEYS, files_setting=ENV_KEY_FILES)

    @property
    def current(self) -> SigningKey:
        """The key new signatures are made with."""
        return self.keys[0]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(key.id for key in self.keys)

    def sealed_id(self, plain: str) -> str:
        """The ``redrive-id`` a holder of this ring writes for a request whose id, made
        from its fields, is ``plain`` (:func:`redrive.headers.failure_request_id`): a
        keyed digest of it, as deterministic (a hand-off repeated after a crash has the
        same), but one that no one without the current key can compute, so that no
        outsider can send a request under it before the sender does."""
        try:
            data = bytes.fromhex(plain)
        except ValueError:
            data = plain.encode("utf-8", "surrogatepass")
        key = self.current.identity_key
        return hashlib.blake2b(data, digest_size=_ID_BYTES, key=key).hexdigest()

    def signature(self, headers: Iterable[Header], key: bytes | None, value: bytes | None) -> str:
        """The ``redrive-signature`` value for a request of these headers, key and value."""
        current = self.current
        mac = current.mac(canonical(headers, key, value))
        return f"{VERSION}:{current.id}:{_text(mac).decode()}"

    def signed(
        self, headers: Sequence[Header], key: bytes | None, value: bytes | None
    ) -> list[Header]:
        """The headers with this ring's signature last, instead of any they had."""
        kept = [header for header in headers if header[0] != SIGNATURE]
        return [*kept, (SIGNATURE, self.signature(kept, key, value).encode("ascii"))]

    def verify(
        self,
        headers: Iterable[Header],
        key: bytes | None,
        value: bytes | None,
        signature: str | None,
        *,
        value_digest: bytes | None = None,
    ) -> Verification:
        """Whether ``signature`` (the request's ``redrive-signature``, None if it has
        none) is this ring's over the rest of the request. Never raises."""
        if signature is None:
            return _UNSIGNED
        parts = signature.split(":")
        if len(parts) != 3 or parts[0] != VERSION or not parts[1] or not parts[2]:
            return Verification(Verdict.MALFORMED, f"the signature is not {VERSION}:<key id>:<MAC>")
        key_id = parts[1]
        signing_key = self._by_id.get(key_id)
        if signing_key is None:
            return Verification(
                Verdict.UNKNOWN_KEY, f"the signature names key {key_id[:70]!r}, not one of ours"
            )
        try:
            given = parts[2].encode("ascii")
            expected = signing_key.mac(canonical(headers, key, value, value_digest=value_digest))
        except (ValueError, TypeError, UnicodeError):
            return Verification(Verdict.MALFORMED, "the signature or the headers are unreadable")
        if not hmac.compare_digest(given, _text(expected)):
            return Verification(
                Verdict.MISMATCH,
                f"the signature (key {key_id!r}) does not match the request's headers, key "
                "and value",
            )
        return _VALID


@dataclass(frozen=True, slots=True)
class SignatureCheck:
    """What a receiver of the requests topic asks of a request's signature.

    ``required``: anything but a valid signature is refused. Not required: an unsigned
    request, or one signed with a key this receiver does not know (or in a form it
    cannot read), is accepted as an unsigned one would be; a signature naming one of
    its keys must verify (a sender does not name our key by chance).
    """

    keys: KeyRing | None
    required: bool

    def __post_init__(self) -> None:
        if self.required and self.keys is None:
            raise ValueError("signatures cannot be required without keys to check them")

    def refusal(
        self,
        headers: Iterable[Header],
        key: bytes | None,
        value: bytes | None,
        signature: str | None,
    ) -> str | None:
        """Why the request is refused, or None when it passes."""
        return self.judge(headers, key, value, signature).refusal

    def judge(
        self,
        headers: Iterable[Header],
        key: bytes | None,
        value: bytes | None,
        signature: str | None,
        *,
        value_digest: bytes | None = None,
    ) -> Judgement:
        """Whether the request passes, and whether a key of ours vouches for it."""
        if self.keys is None:
            return _PASSES
        if signature is None and not self.required:
            return _PASSES
        found = self.keys.verify(headers, key, value, signature, value_digest=value_digest)
        if found.verdict is Verdict.VALID:
            return _VOUCHED
        if self.required or found.verdict is Verdict.MISMATCH:
            return Judgement(found.problem, vouched=False)
        return _PASSES


@dataclass(frozen=True, slots=True)
class Judgement:
    """What :meth:`SignatureCheck.judge` found of one request."""

    refusal: str | None
    """Why it is refused; None: it passes."""
    vouched: bool
    """Its signature verified with one of our keys: it was written by a holder of one."""


_PASSES: Final = Judgement(None, vouched=False)
_VOUCHED: Final = Judgement(None, vouched=True)


# ------------------------------------------------------------------------ loading keys

ENV_KEYS: Final = "REDRIVE_SIGNING_KEYS"
ENV_KEY_FILES: Final = "REDRIVE_SIGNING_KEY_FILES"


def _json_list(environ: Mapping[str, str], name: str) -> list[str]:
    text = environ.get(name, "").strip()
    if not text:
        return []
    try:
        given = json.loads(text)
    except ValueError:
        given = None
    if not isinstance(given, list) or not all(isinstance(item, str) for item in given):
        raise ConfigError(
            name, "is not a JSON list of strings", f"set it as {name}='[\"k1=<base64>\"]'"
        )
    return given


def parse_key(text: str, setting: str) -> SigningKey:
    """``id=secret``, the secret in base64 (standard or URL-safe, padding optional);
    a ConfigError naming ``setting`` when it is not one."""
    key_id, sep, encoded = text.strip().partition("=")
    if not sep or not key_id.strip():
        raise ConfigError(
            setting,
            "a signing key is not in the form id=secret",
            "give each key as <key id>=<base64 secret>, e.g. k2026=$(openssl rand -base64 32)",
        )
    secret = _decoded(encoded.strip(), setting, key_id.strip())
    try:
        return SigningKey(key_id.strip(), secret)
    except ValueError as exc:
        raise ConfigError(setting, str(exc), "use a longer secret or a plain key id") from None


def _decoded(encoded: str, setting: str, key_id: str) -> bytes:
    padded = encoded + "=" * (-len(encoded) % 4)
    alphabet = "-_" if ("-" in encoded or "_" in encoded) else "+/"
    try:
        return base64.b64decode(padded, altchars=alphabet.encode(), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(
            setting,
            f"the secret of key {key_id[:70]!r} is not base64",
            "encode the secret in base64 (openssl rand -base64 32)",
        ) from None


def read_key_file(path: Path, setting: str) -> list[SigningKey]:
    """The keys of ``path``: a folder holds one key per file, named by its file name
    (a Kubernetes secret mounted as a volume); a file holds ``id=secret`` lines
    (blank lines and ``#`` comments skipped)."""
    try:
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
            if not files:
                raise ConfigError(setting, f"{path} holds no key file", "put one file per key")
            return [parse_key(f"{p.name}={p.read_text('utf-8')}", setting) for p in files]
        lines = path.read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(setting, f"cannot read {path}: {exc}", "give a readable file") from None
    keys = [parse_key(line, setting) for line in lines if line.strip() and not line.startswith("#")]
    if not keys:
        raise ConfigError(setting, f"{path} holds no key", "write one id=secret line per key")
    return keys


def key_ring(
    keys: Iterable[str] = (),
    files: Iterable[str | Path] = (),
    *,
    setting: str = "signing_keys",
    files_setting: str = "signing_key_files",
) -> KeyRing | None:
    """The ring of the keys given inline (``id=secret``) and in files, in that order
    (the first signs); None when none is given. A bad key stops start-up with a
    ConfigError naming its setting."""
    found = [parse_key(text, setting) for text in keys]
    for path in files:
        found += read_key_file(Path(path), files_setting)
    if not found:
        return None
    try:
        return KeyRing(tuple(found))
    except ValueError as exc:
        raise ConfigError(setting, str(exc), "give each key its own id") from None
