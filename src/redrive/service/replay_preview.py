"""Dry runs of replays: what a replay would send where, without sending or storing.

A dry run of a single replay, a selection by ids or a filter tells, for the letters
a real replay would take (the same selection, capped the same way):

- how many would go to each destination topic and partition (``None``: placed by
  key by the producer's partitioner, as the service never computes it in Python);
- a sample of the first five: id, key, destination, partition and the headers it
  would carry;
- which of the letters' headers would be stripped (the redrive ones, and those an
  edit replaces), with how many letters carry each (the loop guard's two are not
  stripped but written anew: the sample shows their new values);
- the letters that would be refused (destination not allowed, topic missing) and
  those a job would skip (quarantined by the loop guard, :mod:`.replay_guard`), and
  why; and a conflict with a job that still has some of them to send.

It is built with the replay's own functions, :meth:`.replay.Replayer.target_of` and
:func:`.replay.replayed_message`, so a preview cannot disagree with the replay. It
changes nothing: no Kafka write, no store write but the caller's audit entry.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from redrive.headers import REPLAY_OF, REPLAYS, Header
from redrive.service.replay import Edit, ReplayRefused, Target, replayed_message
from redrive.service.store import DeadLetter

SAMPLE_SIZE = 5


@dataclass(frozen=True, slots=True)
class Sampled:
    """One letter as it would be sent."""

    letter_id: int
    key: bytes | None
    topic: str
    partition: int | None
    headers: list[Header]


@dataclass(frozen=True, slots=True)
class Passed:
    """A letter that would not be sent, and why."""

    letter_id: int
    reason: str


@dataclass(slots=True)
class Preview:
    """What a replay would do (see the module)."""

    selected: int = 0
    sends: Counter[tuple[str, int | None]] = field(default_factory=Counter)
    sample: list[Sampled] = field(default_factory=list)
    stripped: Counter[str] = field(default_factory=Counter)
    refused: list[Passed] = field(default_factory=list)
    skipped: list[Passed] = field(default_factory=list)
    remaining: int = 0
    """How many more letters match the filter than a replay takes at once."""
    conflict: str | None = None
    """Why a real replay would be refused whole (a job still to send some of them)."""

    @property
    def would_send(self) -> int:
        return sum(self.sends.values())


def _stripped(letter: DeadLetter, sent: list[Header]) -> Iterable[str]:
    """The letter's headers that its copy would not carry as they are (but the loop
    guard's own, which a replay writes anew rather than strips)."""
    kept = set(sent)
    return (
        name
        for name, value in letter.headers
        if (name, value) not in kept and name not in (REPLAYS, REPLAY_OF)
    )


def preview(
    letters: Iterable[DeadLetter],
    *,
    target_of: Callable[[DeadLetter], Target],
    skip: Callable[[DeadLetter], str | None],
    edit: Edit | None = None,
    missing: Iterable[int] = (),
) -> Preview:
    """The preview of replaying ``letters`` (``missing``: ids asked for that are gone)."""
    shown = Preview()
    for letter_id in missing:
        shown.selected += 1
        shown.refused.append(Passed(letter_id, f"no dead letter {letter_id}"))
    for letter in letters:
        shown.selected += 1
        if (why := skip(letter)) is not None:
            shown.skipped.append(Passed(letter.id, why))
            continue
        try:
            target = target_of(letter)
        except ReplayRefused as exc:
            shown.refused.append(Passed(letter.id, str(exc)))
            continue
        _, headers = replayed_message(letter, edit)
        shown.sends[(target.topic, target.partition)] += 1
        shown.stripped.update(_stripped(letter, headers))
        if len(shown.sample) < SAMPLE_SIZE:
            shown.sample.append(
                Sampled(letter.id, letter.msg_key, target.topic, target.partition, headers)
            )
    return shown


__all__ = ["SAMPLE_SIZE", "Passed", "Preview", "Sampled", "preview"]
