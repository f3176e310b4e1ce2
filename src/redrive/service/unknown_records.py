"""A dead letter whose record is unknown is never replayed as an empty record.

A share group's dead letter names its record by topic, partition and offset, and
intake reads the record there (:mod:`.ingest.originals`); when the topic no longer
had it, the letter is stored with ``record_missing`` set and no key, value or headers.
Replaying it as it is would write a record with a null key and value to the topic,
which its consumers would take for a real one. So, in every replay path:

- a single replay is refused (409) unless the operator gives the value to send;
- a replay job passes it over, counted as skipped, with this reason;
- dry runs say the same, so a preview counts it as skipped, not as one to send.
"""

from __future__ import annotations

from redrive.service.replay import Edit
from redrive.service.store import DeadLetter


def unknown_record_reason(letter: DeadLetter, edit: Edit | None = None) -> str | None:
    """Why the letter cannot be replayed as it is (None: it can)."""
    if not letter.record_missing or (edit is not None and edit.value is not None):
        return None
    return (
        "its record is unknown (its topic no longer had the record when the letter was "
        "read): a replay would write an empty record; give the value to replay it with"
    )


__all__ = ["unknown_record_reason"]
