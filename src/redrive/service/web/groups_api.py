"""The REST API of error groups, under /api/v1: the groups, a group, its letters, and
what operators do to a whole group (replay, delete, mute) or to a letter (move it to
another group).

Reads and roles as in :mod:`.api` (reads open unless `require_token_for_reads`; every
mutation needs an operator token); the actions are :mod:`redrive.service.group_actions`,
which write the audit log.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Response

from redrive.service.filters import DeadLetterFilter
from redrive.service.fingerprints import FINGERPRINT_PATTERN
from redrive.service.group_actions import GroupActions, GroupMove, GroupReplay
from redrive.service.store import ErrorGroup
from redrive.service.web.api import (
    READ,
    Cursor,
    LetterId,
    Limit,
    Operator,
    Reader,
    _errors,
)
from redrive.service.web.deps import Actions, Ops, StoreDep
from redrive.service.web.representations import dead_letter_summary, replay_job_view

router = APIRouter(prefix="/api/v1", responses=_errors(401))

GroupId = Annotated[
    str,
    Path(pattern=FINGERPRINT_PATTERN, description="The group's fingerprint: 16 hex digits."),
]
Order = Literal["count", "last_seen"]


def _group_actions(store: StoreDep, ops: Ops, actions: Actions) -> GroupActions:
    return GroupActions(store, ops, actions)


Groups = Annotated[GroupActions, Depends(_group_actions)]


def error_group_view(group: ErrorGroup) -> dict[str, Any]:
    """A group as the API answers it (the pages show the same)."""
    return {
        "error_group": group.error_group,
        "title": group.title,
        "count": group.count,
        "first_seen": group.first_seen.isoformat(),
        "last_seen": group.last_seen.isoformat(),
        "topics": list(group.topics),
        "groups": list(group.consumer_groups),
        "muted": group.muted,
        "muted_by": group.muted_by,
        "hourly": list(group.hourly),
    }


@router.get("/error-groups", openapi_extra=READ)
def list_error_groups(
    who: Reader,
    store: StoreDep,
    order: Annotated[Order, Query(description="Most letters first, or latest first.")] = "count",
    topic: Annotated[
        str | None,
        Query(max_length=249, pattern=r"^[^\x00]*$", description="Groups with letters on it."),
    ] = None,
    muted: Annotated[bool | None, Query(description="Only muted, or unmuted, groups.")] = None,
    limit: Limit = 50,
) -> dict[str, Any]:
    """The error groups with dead letters: each one's count, first and last seen, the
    topics and consumer groups of its letters, and its letters in each of the last 24
    hours (`hourly`, oldest hour first)."""
    rows = store.error_groups(order=order, topic=topic, muted=muted, limit=limit)
    return {"items": [error_group_view(g) for g in rows]}


@router.get("/error-groups/{error_group}", responses=_errors(404), openapi_extra=READ)
def get_error_group(who: Reader, store: StoreDep, error_group: GroupId) -> dict[str, Any]:
    group = store.error_group(error_group)
    if group is None:
        raise HTTPException(404, f"no error group {error_group} with dead letters")
    return error_group_view(group)


@router.get("/error-groups/{error_group}/dead-letters", responses=_errors(400), openapi_extra=READ)
def list_group_letters(
    who: Reader, ops: Ops, error_group: GroupId, limit: Limit = 50, cursor: Cursor = None
) -> dict[str, Any]:
    """The group's dead letters, newest first (as GET /dead-letters?error_group=...)."""
    rows, nxt = ops.dead_letters(
        DeadLetterFilter(error_group=error_group), limit=limit, cursor=cursor
    )
    return {"items": [dead_letter_summary(r) for r in rows], "next_cursor": nxt}


@router.post(
    "/error-groups/{error_group}/replay",
    status_code=202,
    responses=_errors(400, 403, 404, 409, 413),
)
def replay_group(
    who: Operator,
    groups: Groups,
    error_group: GroupId,
    response: Response,
    body: GroupReplay | None = None,
) -> dict[str, Any]:
    """Start a replay job over the group's letters (follow it at the `Location`)."""
    started = groups.replay(who, error_group, body or GroupReplay())
    response.headers["location"] = f"/api/v1/jobs/{started.job.id}"
    return {"job": replay_job_view(started.job), "remaining": started.remaining}


@router.post("/error-groups/{error_group}/delete", responses=_errors(403, 404))
def delete_group(who: Operator, groups: Groups, error_group: GroupId) -> dict[str, Any]:
    """Delete every letter of the group."""
    return groups.delete(who, error_group)


@router.post("/error-groups/{error_group}/mute", responses=_errors(403, 404))
def mute_group(who: Operator, groups: Groups, error_group: GroupId) -> dict[str, Any]:
    """No surge alert for the group; its letters are still stored."""
    return groups.mute(who, error_group, muted=True)


@router.post("/error-groups/{error_group}/unmute", responses=_errors(403, 404))
def unmute_group(who: Operator, groups: Groups, error_group: GroupId) -> dict[str, Any]:
    return groups.mute(who, error_group, muted=False)


@router.post("/dead-letters/{letter_id:int}/move", responses=_errors(400, 403, 404, 413))
def move_letter(
    who: Operator, groups: Groups, letter_id: LetterId, body: GroupMove
) -> dict[str, Any]:
    """Put a letter in another (existing) error group; its fingerprint is kept."""
    return groups.move(who, letter_id, body)
