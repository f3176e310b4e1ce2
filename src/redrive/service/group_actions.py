"""What operators do to an error group, whoever asks: the REST API and the web UI
call these.

A group's replay and delete are the bulk actions of :mod:`.actions` over the
selection ``{"error_group": <fingerprint>}`` (a replay job, audited as ``replay-job``;
a delete, audited as ``delete``, each with that filter); muting and moving a letter
to another group are audited here (``mute-group``, ``unmute-group``,
``move-to-group``). As in :mod:`.actions`, a refusal is an ActionRefused of its kind,
and the caller has checked the role (operator).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from redrive.service.actions import (
    JobStarted,
    OperatorActions,
    ReplayMany,
    ReplaySettings,
    Selection,
)
from redrive.service.auth import Principal
from redrive.service.filters import DeadLetterFilter
from redrive.service.fingerprints import FINGERPRINT_PATTERN
from redrive.service.operations import Operations
from redrive.service.refusals import NotFound
from redrive.service.store import Store


class GroupReplay(ReplaySettings):
    """A replay of every letter of the group (as many as `replay_max_per_request`)."""


class GroupMove(BaseModel):
    """The group to put a letter in (an existing group's fingerprint)."""

    model_config = ConfigDict(extra="forbid")
    error_group: str = Field(pattern=FINGERPRINT_PATTERN, description="16 hex digits.")


def _of(error_group: str) -> DeadLetterFilter:
    return DeadLetterFilter(error_group=error_group)


class GroupActions:
    def __init__(self, store: Store, operations: Operations, actions: OperatorActions) -> None:
        self._store = store
        self._ops = operations
        self._actions = actions

    def _letters(self, error_group: str) -> None:
        if self._store.count_dead_letters(_of(error_group)) == 0:
            raise NotFound(f"no error group {error_group} with dead letters")

    def replay(self, who: Principal, error_group: str, body: GroupReplay) -> JobStarted:
        """A replay job over the group's letters, oldest first."""
        self._letters(error_group)
        selection = ReplayMany(filter=_of(error_group), **body.model_dump())
        return self._actions.replay_many(who, selection)

    def delete(self, who: Principal, error_group: str) -> dict[str, Any]:
        self._letters(error_group)
        return self._actions.delete_many(who, Selection(filter=_of(error_group)))

    def mute(self, who: Principal, error_group: str, *, muted: bool) -> dict[str, Any]:
        """Mute (no surge alert; its letters are still stored) or unmute."""
        before = self._store.mute_error_group(error_group, muted=muted, by=who.name)
        if before is None:
            raise NotFound(f"no error group {error_group}")
        self._ops.audit(
            actor=who.name,
            role=who.role,
            action="mute-group" if muted else "unmute-group",
            detail={"error_group": error_group, "was_muted": before},
        )
        return {"error_group": error_group, "muted": muted}

    def move(self, who: Principal, letter_id: int, body: GroupMove) -> dict[str, Any]:
        """Put a letter in another group; its fingerprint stays what it was."""
        to = body.error_group
        if not self._store.error_group_exists(to):
            raise NotFound(f"no error group {to}")
        before = self._store.move_to_error_group(letter_id, to)
        if before is None:
            raise NotFound(f"no dead letter {letter_id}")
        self._ops.audit(
            actor=who.name,
            role=who.role,
            action="move-to-group",
            ids=[letter_id],
            count=1,
            detail={"from": before, "to": to},
        )
        return {"id": letter_id, "from": before, "error_group": to}
