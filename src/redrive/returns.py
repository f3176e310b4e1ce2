"""What a reader believes of the redrive headers on a record that comes back to it.

A record read again after a failure (delivered by the retry service or the Spark
scheduler on its topic or the group's own retry topic, or read from a tier topic)
carries the redrive headers of its request: its attempt, its original coordinates, its
``redrive-id``. A reader (the App, the share-group App, the Spark pipeline) takes the
record's place in its policy from them, and skips a copy of a delivery it handled by
the id. But anyone who may write a topic may write those headers, and stream processors
copy headers from the records they read into the ones they write. So a reader believes
them only where :class:`ReturnCheck` does:

- they name, as the destination, the topic the record is read on (or, for a tier
  record, the topic its tier serves), and as the partition, if they name one, the
  partition it is read on: a copy on another topic is not a return;
- with keys: the record carries a signature of one of them (``redrive-signature``,
  :mod:`redrive.signing`) over those headers, its key and its value, as every writer
  of returns signs them (the App its requests and tier records, the retry service and
  the Spark scheduler what they deliver).

What a reader does with a record it cannot believe is the reader's: on a source topic
it is a new record (handled at attempt 1, named by where it was read); on a retry path
(a tier, the single retry topic, the group's own retry topic) it is refused.

Invariant: :meth:`ReturnCheck.doubt` is None only for headers that pass both rules;
it never raises, whatever the record holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redrive.header_fields import SIGNATURE, Header, RetryHeaders
from redrive.signing import KeyRing, Verdict


@dataclass(frozen=True, slots=True)
class ReturnCheck:
    """What a reader asks of a record's redrive headers before it believes them.

    ``keys``: the reader's signing keys (None: it has none, and believes what names
    the topic it is read on). ``trust_unsigned``: while senders and the retry service
    are rolled over to signing, an unsigned return is believed as without keys (a
    signature naming one of the keys must still verify)."""

    keys: KeyRing | None = None
    trust_unsigned: bool = False

    def doubt(
        self,
        headers: Sequence[Header],
        key: bytes | None,
        value: bytes | None,
        delivery: RetryHeaders,
        read_on: tuple[str, int],
        destination: str,
    ) -> str | None:
        """Why ``delivery`` (the redrive headers read off a record of ``headers``, key and
        value, read on ``read_on``, topic and partition) is not to be believed, or None.
        ``destination``: the topic a genuine return names (the topic read, or the one a
        tier serves)."""
        topic, partition = read_on
        if delivery.destination != destination:
            return (
                f"its redrive headers name destination {delivery.destination[:300]!r}, "
                f"not {destination!r}: a copy, not a return"
            )
        if delivery.partition is not None and delivery.partition != partition:
            return (
                f"its redrive headers name partition {delivery.partition}, not {partition} "
                f"of {topic!r}, where it was read: a copy, not a return"
            )
        if self.keys is None:
            return None
        signature = signature_of(headers)
        if signature is None and self.trust_unsigned:
            return None
        found = self.keys.verify(headers, key, value, signature)
        if found.verdict is Verdict.VALID:
            return None
        return f"its redrive headers are not signed by our keys: {found.problem}"


def signature_of(headers: Sequence[Header]) -> str | None:
    """A record's ``redrive-signature`` as text; None when it has none. Two, or one that
    is not text, read as a signature that verifies for nothing."""
    found = None
    for name, raw in headers:
        if name != SIGNATURE:
            continue
        if found is not None or not isinstance(raw, bytes) or not raw.isascii():
            return _UNREADABLE  # two, or not text: verifies as no signature does
        found = raw.decode("ascii")
    return found


_UNREADABLE = "unreadable"
