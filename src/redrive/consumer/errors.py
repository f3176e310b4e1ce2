"""The errors redrive itself gives a record that cannot reach its handler.

Each is a :class:`redrive.policy.FatalError`: retrying cannot help, so the record
goes to the dead letters at once, named by the public name users search for.
"""

from __future__ import annotations

from redrive.policy import FatalError


class DeserializationError(FatalError):
    """A record's value could not be deserialized: retrying cannot help."""


class UnreadableHeadersError(FatalError):
    """A record's headers cannot all be read (a header name that is not UTF-8, which
    any Kafka producer can write): it goes to the dead letters with those that can."""


class UnprocessableRecordError(FatalError):
    """redrive's own work on a record failed (not its handler's): rather than stop the
    consumer at that record, it goes to the dead letters with the cause."""


# Dead letters name them by their public names, the ones users import and search for.
DeserializationError.__module__ = "redrive"
UnreadableHeadersError.__module__ = "redrive.consumer"
UnprocessableRecordError.__module__ = "redrive.consumer"
