"""The REST API's safe-replay routes: dry runs of replays, and a letter's rounds.

- ``POST /api/v1/dead-letters/{id}/replay/dry-run`` and ``POST
  /api/v1/dead-letters/replay/dry-run`` take the body of the replay they preview
  (``ReplayOne``, ``ReplayMany``) and answer what it would send where
  (:mod:`redrive.service.replay_preview`), changing nothing; an operator's, like the
  replay, and in the audit log;
- ``GET /api/v1/dead-letters/{id}/rounds``: the loop guard's rounds of the letter's
  line (each replay, and what came back), also for a letter replayed and deleted.

Scheduling (``start_at``) and the quarantine override are fields of the replay
bodies themselves (:mod:`redrive.service.actions`).
"""

from typing import Any

from fastapi import APIRouter

from redrive.service.actions import ReplayMany, ReplayOne
from redrive.service.web.api import READ, LetterId, Operator, Reader
from redrive.service.web.api import _errors as error_responses
from redrive.service.web.deps import Actions, StoreDep
from redrive.service.web.representations import preview_view, rounds_view

router = APIRouter(prefix="/api/v1", responses=error_responses(401))


@router.post(
    "/dead-letters/{letter_id:int}/replay/dry-run", responses=error_responses(400, 403, 404, 413)
)
def dry_run_one(
    who: Operator, actions: Actions, letter_id: LetterId, body: ReplayOne | None = None
) -> dict[str, Any]:
    """What POST /dead-letters/{letter_id}/replay with this body would send, and where;
    nothing is sent or changed (the dry run is recorded in the audit log)."""
    return preview_view(actions.dry_run_one(who, letter_id, body))


@router.post("/dead-letters/replay/dry-run", responses=error_responses(400, 403, 413))
def dry_run_many(who: Operator, actions: Actions, body: ReplayMany) -> dict[str, Any]:
    """What POST /dead-letters/replay with this body would send, and where: per
    destination and partition, a sample of five, the headers stripped, the letters
    refused or skipped and why; nothing is sent, no job is made (the dry run is
    recorded in the audit log)."""
    return preview_view(actions.dry_run_many(who, body))


@router.get(
    "/dead-letters/{letter_id:int}/rounds", responses=error_responses(404), openapi_extra=READ
)
def rounds(who: Reader, store: StoreDep, letter_id: LetterId) -> dict[str, Any]:
    """The rounds of the letter's line, first first: each replay (when, by whom, where
    to) and the dead letter it came back as, when, with which error. Empty for a letter
    never replayed."""
    found = store.replay_rounds([letter_id]).get(letter_id, [])
    return {"dead_letter_id": letter_id, "rounds": rounds_view(found)}
