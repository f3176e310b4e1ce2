"""The loop guard: a dead letter that keeps coming back from its replays is quarantined.

A replayed copy carries its round (``redrive-replays``) and its letter
(``redrive-replay-of``, :mod:`.replay`); redrive's senders keep both through the copy's
retries into its next dead letter, which the store links to the letter it came back
from (:mod:`.store.replay_rounds`). A letter that came back dead after
``quarantine_after_replays`` replays (a service setting, 3 unless set) is stored
quarantined (:mod:`.store.intake_writes`): replaying it again would most likely only
make it come back again. So:

- bulk replay jobs pass it over: the job counts it as skipped, with the reason;
- a single replay of it is refused unless the operator overrides the quarantine,
  which the audit log records;
- the UI flags it, and its story shows each round (replayed when, came back when,
  with which error).

Dry runs (:mod:`.replay_preview`) apply the same rule, so a preview says which
letters a job would skip.
"""

from __future__ import annotations

from redrive.service.store import DeadLetter


def quarantine_reason(letter: DeadLetter) -> str | None:
    """Why a bulk replay passes the letter over (None: it does not)."""
    if not letter.quarantined:
        return None
    return (
        f"quarantined: came back dead after {letter.replays} replays "
        f"(last replayed from dead letter {letter.replay_of}); replay it alone, "
        "overriding the quarantine, to send it anyway"
    )


__all__ = ["quarantine_reason"]
