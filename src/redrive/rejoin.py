"""A consumer that lost its partitions and is given none back: it subscribes again.

When a broker is unreachable for longer than the group's session timeout, the
consumer's session times out and librdkafka revokes its partitions ("lost") and
rejoins the group once a broker answers. On a busy machine we have seen that rejoin
never happen after the broker came back: the consumer stayed out of its group, with
no assignment and no error, until it was restarted (an App; the retry service's
intake, whose coordinator requests then sat unsent in librdkafka's queue). So both
watch for it: if no assignment (not even an empty one) has come
:data:`REJOIN_AFTER_S` after the partitions were lost, the consumer unsubscribes and
subscribes again, which starts a fresh join (intake joins with a new client instead:
see :meth:`redrive.service.intake.Intake._rejoin`); and again every
:data:`REJOIN_AFTER_S` while none comes.

Invariant: :meth:`RejoinWatch.due` is true only while partitions were lost and no
assignment came since, at most once per :data:`REJOIN_AFTER_S`. An App that has no
partitions because the group has more members than partitions still gets its
(empty) assignments, and is never subscribed again.
"""

from __future__ import annotations

from typing import Final

REJOIN_AFTER_S: Final = 60.0
"""How long after losing its partitions a consumer waits for an assignment before it
subscribes again: well beyond a rejoin on a loaded machine (seconds)."""


class RejoinWatch:
    def __init__(self, after_s: float = REJOIN_AFTER_S) -> None:
        self.after_s = after_s
        self._since: float | None = None

    def lost(self, now: float) -> None:
        """The partitions were lost (the session timed out): an assignment is due."""
        if self._since is None:
            self._since = now

    def assigned(self) -> None:
        """An assignment came (maybe empty): the consumer is in its group."""
        self._since = None

    def due(self, now: float) -> bool:
        """Whether to subscribe again now (then the wait starts over)."""
        if self._since is None or now - self._since < self.after_s:
            return False
        self._since = now
        return True
