"""Why an operator action was not done, by kind of reason.

The actions and operations say what happened in the domain's terms; the web wing
decides how each kind is answered (its HTTP status: ``web/app.py``), and the pages
show the sentence.
"""

from __future__ import annotations


class ActionRefused(Exception):
    """An operator action that was not done (nothing changed); `detail` says why."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class NotFound(ActionRefused):
    """What it acts on does not exist (any more)."""


class Conflict(ActionRefused):
    """What it acts on is in a state that forbids it now: held in its key's queue,
    still to be sent by a running replay job, a replay job that has ended."""


class Invalid(ActionRefused):
    """Asked for something that cannot be done: a destination that is not allowed or
    does not exist, a selection that matches nothing."""


class NotAcknowledged(ActionRefused):
    """The broker did not acknowledge what was sent to it."""
