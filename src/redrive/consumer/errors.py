"""The errors redrive itself gives a record that cannot reach its handler.

Each is a :class:`redrive.policy.FatalError`: retrying cannot help, so the record
goes to the dead letters at once, named by the public name users search for.

Below them, the batch handlers' own: :class:`BatchFailed`, which a batch handler
raises to say which of its records failed, and :class:`InvalidBatchFailureError`,
what every record of a batch fails with when that BatchFailed does not make sense
(not fatal: each record's policy decides, as for any other handler error).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from redrive.policy import FatalError


class DeserializationError(FatalError):
    """A record's value could not be deserialized: retrying cannot help."""


class UnreadableHeadersError(FatalError):
    """A record's headers cannot all be read (a header name that is not UTF-8, which
    any Kafka producer can write): it goes to the dead letters with those that can."""


class UnprocessableRecordError(FatalError):
    """redrive's own work on a record failed (not its handler's): rather than stop the
    consumer at that record, it goes to the dead letters with the cause."""


class RefusedReturnError(FatalError):
    """A record on a retry path (a tier, the single retry topic, the group's own retry
    topic) whose redrive headers the App cannot believe: forged, copied from another
    topic, or not signed by the App's keys (:mod:`redrive.consumer.refusals`). It is
    never handled; its dead letter says why."""


# Dead letters name them by their public names, the ones users import and search for.
DeserializationError.__module__ = "redrive"
UnreadableHeadersError.__module__ = "redrive.consumer"
UnprocessableRecordError.__module__ = "redrive.consumer"
RefusedReturnError.__module__ = "redrive.consumer"


class BatchFailed(Exception):
    """Raised by a batch handler (``@app.batch_handler``): these records of the batch
    failed, each with its own error; the others were handled.

    ``failures`` maps each failed record, by its index in the batch or by the
    :class:`~redrive.consumer.message.Message` itself, to the exception it failed
    with. A Message is not hashable, so name messages as pairs instead of a dict:
    ``BatchFailed([(message, error), ...])``; indices go either way
    (``BatchFailed({3: error})``). Each failed record then goes to a retry or the dead
    letters by its own policy, exactly as if a single-record handler had raised its
    error. A BatchFailed that names no record, a record twice, an index out of range,
    a message not in the batch, or something other than an exception fails the whole
    batch with :class:`InvalidBatchFailureError`: never is a record silently handled.
    """

    def __init__(
        self,
        failures: Mapping[Any, BaseException] | Iterable[tuple[Any, BaseException]],
    ) -> None:
        items = failures.items() if isinstance(failures, Mapping) else failures
        self.failures: list[tuple[Any, Any]] = list(items)
        """The ``(index or message, error)`` pairs, as given (checked by the App)."""
        super().__init__(f"{len(self.failures)} record(s) of the batch failed")


class InvalidBatchFailureError(ValueError):
    """A batch handler raised a :class:`BatchFailed` that does not name records of its
    batch with their errors (an index out of range, a message of another batch...):
    every record of the batch fails with this error, each by its own policy, as when
    a batch handler raises any other exception."""


BatchFailed.__module__ = "redrive"
InvalidBatchFailureError.__module__ = "redrive.consumer"
