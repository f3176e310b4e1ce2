"""Error groups: which dead letters are the same failure (pure; never raises).

A dead letter's fingerprint is a digest of three things, and two letters are of one
group exactly when all three are equal:

1. its **error type** as stored (``json.decoder.JSONDecodeError``, a Spring letter's
   exception class, a Connect letter's ``exception.class.name``), exactly;
2. its **error message, masked**: what differs between two occurrences of one failure
   is replaced by a placeholder, in this order: quoted values (``'...'``, ``"..."``,
   backquoted) by ``'<q>'``, unless the message is one quoted value and nothing else
   (Python's ``KeyError('customer_id')`` says ``'customer_id'``: the quote is what
   tells two such failures apart, and it keeps its words, its digits masked below);
   e-mail-like addresses by ``<email>``; UUIDs by ``<uuid>``; ``0x`` hexadecimal
   values (object addresses) by ``<hex>``; then every remaining word holding a digit
   (numbers, ids such as ``order-42``, hashes and other hex strings, times, sizes) by
   ``<n>``, less the punctuation ending it; white space runs become one space. Words
   without a digit are kept: they say what failed;
3. the **application's frame**: the frame of its stack trace nearest to where the
   error was raised that belongs to the application, as ``module/file:function``
   (line numbers dropped, so that a deploy does not split a group). Frames of the
   standard library, of ``site-packages``/``dist-packages``, of redrive itself, and
   of the JVM's frameworks (``java.``, ``org.springframework.``,
   ``org.apache.kafka.``, ...: :data:`JVM_FRAMEWORKS`) do not count. In a Python
   trace (outermost frame first) it is the *last* such frame; in a JVM trace
   (innermost first) the *first*. No trace, or no frame of the application: none.

A letter with no error at all (a request refused by intake, a retry the broker
refused for good) is grouped by its reason code and its masked reason instead.

The title a person reads is the type and the masked message (or the reason code and
masked reason). A fingerprint is 16 hex digits; it names the group in the store, the
API and the UI. :data:`VERSION` is part of the digest: a change of these rules is a
new version (and a migration that computes the stored fingerprints again).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Final

VERSION: Final = "2"
FINGERPRINT_LENGTH: Final = 16
FINGERPRINT_PATTERN: Final = r"^[0-9a-f]{16}$"
MAX_TITLE: Final = 200
# Only the beginning of a message is compared (a request's message is at most 1 KiB;
# another system's may be longer); a trace is read up to this many characters.
_MAX_MESSAGE: Final = 2_000
_MAX_TRACE: Final = 20_000

JVM_FRAMEWORKS: Final = (
    "java.", "javax.", "jdk.", "sun.", "com.sun.", "kotlin.", "kotlinx.", "scala.",
    "org.springframework.", "org.apache.kafka.", "org.apache.catalina.", "org.apache.tomcat.",
    "io.micrometer.", "io.netty.", "reactor.", "com.fasterxml.jackson.", "org.slf4j.",
    "ch.qos.logback.", "org.hibernate.", "io.confluent.",
)  # fmt: skip
"""Packages whose frames are the framework's, not the application's."""

# A quote opens only where a word does not go on (the apostrophe of "can't" does not).
_QUOTED = re.compile(r"(?<!\w)(?:'[^'\n]*'|\"[^\"\n]*\"|`[^`\n]*`)(?!\w)")
# A message that is one quoted value: a missing key's name, a field's.
_ONLY_QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"|`[^`\n]*`")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_UUID = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
)
_HEX = re.compile(r"\b0[xX][0-9a-fA-F]+\b")
# A word holding a digit, less the punctuation that ends it ("(char 0)", "42;").
_DIGITS = re.compile(r"[^\s'\"`<>]*\d(?:[^\s'\"`<>]*[^\s'\"`<>.,;:!?)\]}])?")
_SPACE = re.compile(r"\s+")

# '  File "/app/orders/handlers.py", line 12, in handle'
_PY_FRAME = re.compile(r'^\s*File "([^"]*)", line \d+, in (\S+)', re.MULTILINE)
# '\tat com.example.Orders.handle(Orders.java:42)'
_JVM_FRAME = re.compile(r"^\s*at ([\w$.<>/]+)\.([\w$<>]+)\(", re.MULTILINE)
_PY_NOT_APP = re.compile(
    r"[/\\](?:site|dist)-packages[/\\]|[/\\]lib[/\\]python\d[^/\\]*[/\\]|[/\\]redrive[/\\]"
    r"|^<|^$"
)


@dataclass(frozen=True, slots=True)
class Failure:
    """What a letter says of its failure (any of it may be missing)."""

    error_type: str | None
    error_message: str | None
    error_trace: str | None
    reason_code: str
    reason: str | None


@dataclass(frozen=True, slots=True)
class Grouping:
    """A letter's group: its fingerprint, and the group's title."""

    fingerprint: str
    title: str


def mask(text: str) -> str:
    """``text`` with what varies between occurrences of one failure replaced."""
    text = text[:_MAX_MESSAGE]
    if not _ONLY_QUOTED.fullmatch(text.strip()):
        text = _QUOTED.sub("'<q>'", text)
    text = _EMAIL.sub("<email>", text)
    text = _UUID.sub("<uuid>", text)
    text = _HEX.sub("<hex>", text)
    text = _DIGITS.sub("<n>", text)
    return _SPACE.sub(" ", text).strip()


def _python_frame(path: str, function: str) -> str | None:
    if _PY_NOT_APP.search(path):
        return None
    parts = re.split(r"[/\\]", path)
    return f"{'/'.join(parts[-2:])}:{function}"


def _jvm_frame(cls: str, method: str) -> str | None:
    cls = cls.rsplit("/", 1)[-1]  # Java 9's module or class loader in front: "app//com.x.Y"
    if cls.startswith(JVM_FRAMEWORKS) or cls.startswith("redrive."):
        return None
    return f"{cls}.{method}"


def app_frame(trace: str | None) -> str | None:
    """The application's frame nearest to where the error was raised, or None."""
    if not trace:
        return None
    trace = trace[-_MAX_TRACE:]  # a cut trace keeps its end, where the error was raised
    python = [
        f
        for m in _PY_FRAME.finditer(trace)
        if (f := _python_frame(m.group(1), m.group(2))) is not None
    ]
    if python:
        return mask(python[-1])
    for m in _JVM_FRAME.finditer(trace):
        if (frame := _jvm_frame(m.group(1), m.group(2))) is not None:
            return mask(frame)
    return None


def _cap(text: str) -> str:
    return text if len(text) <= MAX_TITLE else text[: MAX_TITLE - 1] + "…"


def group_of(failure: Failure) -> Grouping:
    """The letter's fingerprint and title (any input: nothing raises)."""
    error_type = (failure.error_type or "").strip()
    message = mask(failure.error_message or "")
    if error_type or message:
        frame = app_frame(failure.error_trace) or ""
        parts = ("error", error_type, message, frame)
        title = f"{error_type}: {message}" if error_type and message else error_type or message
    else:
        reason = mask(failure.reason or "")
        parts = ("reason", failure.reason_code, reason, "")
        title = f"{failure.reason_code}: {reason}" if reason else failure.reason_code
    digest = hashlib.sha256("\x00".join((VERSION, *parts)).encode("utf-8", "replace"))
    # A title is stored as text: no NUL, no lone surrogate.
    title = title.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    return Grouping(digest.hexdigest()[:FINGERPRINT_LENGTH], _cap(title))
