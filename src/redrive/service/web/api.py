"""The REST API under /api/v1: dead letters, pending retries, replay jobs, stats, the
audit log.

Reads are open to anyone who can reach the port unless `require_token_for_reads`
is set (then a viewer token is needed); every mutation needs an operator token
(`Authorization: Bearer rdv_...`) and is done by the operator actions (actions.py),
which write the audit log. A refusal of an action (an ActionRefused of its kind: not
found, conflict, invalid, not acknowledged) or a cursor this API did not return
(FilterError) is answered by the app's handlers (app.py), which choose its status.
"""

import json
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response, Security
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict

from redrive.service.actions import ReplayMany, ReplayOne, Selection
from redrive.service.auth import ANONYMOUS, Principal
from redrive.service.filters import (
    CURSOR_MAX_LENGTH,
    CURSOR_PATTERN,
    INT64_MAX,
    AuditFilter,
    DeadLetterFilter,
    PendingFilter,
    RecordQuery,
)
from redrive.service.web.deps import Actions, Ops, Settings, StoreDep, TokenBook
from redrive.service.web.representations import (
    audit_entry,
    dead_letter_detail,
    dead_letter_summary,
    order_state,
    pending_view,
    queue_item,
    queue_view,
    replay_job_view,
    story_view,
)

NDJSON = "application/x-ndjson"
# Marks the routes anyone may read unless `require_token_for_reads`: the app's
# document turns it into an optional (empty) security requirement, or drops it.
OPEN_READ = "x-redrive-open-read"


class ErrorBody(BaseModel):
    """Every refusal: a sentence saying what is wrong (for 422, naming the field)."""

    detail: str


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for refusals, so the document lists every status a route answers."""
    what = {
        400: "Refused: a cursor this API did not return, a destination that is not "
        "allowed, a record search without a key or topic, or a body that is not JSON",
        401: "No token, an unknown or revoked one, or a malformed Authorization header",
        403: "The token's role may not do this (operator needed)",
        404: "No such dead letter, pending retry or replay job",
        409: "Refused by a key queue's order (the pending retry waits behind its key's "
        "head, or was delivered and waits for its consumer), or by a replay job (the "
        "dead letters are still to be sent by a running job; the job has ended)",
        413: "The request body is over max_request_bytes",
        422: "A malformed parameter or body; the detail names the field",
        502: "The broker did not acknowledge the replayed message",
    }
    return {status: {"model": ErrorBody, "description": what[status]} for status in statuses}


class NdjsonResponse(StreamingResponse):
    """JSON lines, one object per line (declared so the OpenAPI document says so)."""

    media_type = NDJSON


class DeadLetterQuery(DeadLetterFilter):
    """The filter as query parameters: other parameters (limit, cursor) are the route's."""

    model_config = ConfigDict(extra="ignore")


class PendingQuery(PendingFilter):
    model_config = ConfigDict(extra="ignore")


class AuditQuery(AuditFilter):
    model_config = ConfigDict(extra="ignore")


# Ids are bigserial: positive bigints (the `int` path convertor keeps a word such as
# `replay` or `export` from matching an id route).
LetterId = Annotated[int, Path(ge=1, le=INT64_MAX)]
PendingId = Annotated[int, Path(ge=1, le=INT64_MAX)]
JobId = Annotated[int, Path(ge=1, le=INT64_MAX)]
Cursor = Annotated[
    str | None,
    Query(
        max_length=CURSOR_MAX_LENGTH,
        pattern=CURSOR_PATTERN,
        description="The `next_cursor` of the previous page.",
    ),
]
Limit = Annotated[int, Query(ge=1, le=500)]


# ------------------------------------------------------------------ who asks

# Declares the bearer scheme in the OpenAPI document; `principal` reads the header
# itself, so that a malformed one is refused rather than taken as no token.
_BEARER = HTTPBearer(auto_error=False, description="An API token: `redrive token create`.")


def principal(
    request: Request,
    _declared: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)],
    tokens: TokenBook,
) -> Principal:
    header = request.headers.get("authorization", "")
    if not header:
        return ANONYMOUS
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise HTTPException(401, "Authorization must be 'Bearer <token>'")
    found = tokens.verify(token.strip())
    if found is None:
        raise HTTPException(401, "unknown or revoked token")
    return found


def reader(who: Annotated[Principal, Depends(principal)], settings: Settings) -> Principal:
    if settings.require_token_for_reads and not who.may("viewer"):
        raise HTTPException(401, "a viewer or operator token is required")
    return who


def operator(who: Annotated[Principal, Depends(principal)]) -> Principal:
    if who is ANONYMOUS:
        raise HTTPException(401, "this action needs an operator token (Authorization: Bearer)")
    if not who.may("operator"):
        raise HTTPException(403, f"token {who.name!r} has role {who.role}; operator needed")
    return who


Reader = Annotated[Principal, Depends(reader)]
Operator = Annotated[Principal, Depends(operator)]


# The filters are validated by their models, as query parameters, before the handler
# runs: a value PostgreSQL would refuse is a 422 naming the field.
def _dead_letter_filter(query: Annotated[DeadLetterQuery, Query()]) -> DeadLetterFilter:
    return DeadLetterFilter(**query.model_dump())


def _pending_filter(query: Annotated[PendingQuery, Query()]) -> PendingFilter:
    return PendingFilter(**query.model_dump())


def _audit_filter(query: Annotated[AuditQuery, Query()]) -> AuditFilter:
    return AuditFilter(**query.model_dump())


Filter = Annotated[DeadLetterFilter, Depends(_dead_letter_filter)]
Audit = Annotated[AuditFilter, Depends(_audit_filter)]
Pending = Annotated[PendingFilter, Depends(_pending_filter)]

router = APIRouter(prefix="/api/v1", responses=_errors(401))
READ: dict[str, Any] = {OPEN_READ: True}


@router.get("/whoami", openapi_extra=READ)
def whoami(who: Reader) -> dict[str, str]:
    return {"name": who.name, "role": who.role}


# ------------------------------------------------------------------ dead letters


@router.get("/dead-letters", responses=_errors(400), openapi_extra=READ)
def list_dead_letters(
    who: Reader, ops: Ops, flt: Filter, limit: Limit = 50, cursor: Cursor = None
) -> dict[str, Any]:
    rows, nxt = ops.dead_letters(flt, limit=limit, cursor=cursor)
    return {"items": [dead_letter_summary(r) for r in rows], "next_cursor": nxt}


@router.get(
    "/dead-letters/export",
    response_class=NdjsonResponse,
    responses={
        200: {
            "description": "The matching dead letters, newest first, one JSON object "
            "(as GET /dead-letters/{letter_id} answers) per line",
            "content": {NDJSON: {"schema": {"type": "string"}}},
        }
    },
    openapi_extra=READ,
)
def export_dead_letters(who: Reader, ops: Ops, flt: Filter) -> NdjsonResponse:
    # The first page is read before the response starts: once the status line is
    # sent, a failure can only cut the stream short, which a client could take
    # for the whole file.
    first = ops.dead_letters(flt, limit=500)

    def lines() -> Iterator[bytes]:
        rows, cursor = first
        while True:
            for row in rows:
                yield (json.dumps(dead_letter_detail(row), default=str) + "\n").encode()
            if cursor is None:
                return
            rows, cursor = ops.dead_letters(flt, limit=500, cursor=cursor)

    return NdjsonResponse(
        lines(),
        headers={"content-disposition": 'attachment; filename="dead-letters.jsonl"'},
    )


@router.get("/dead-letters/{letter_id:int}", responses=_errors(404), openapi_extra=READ)
def get_dead_letter(who: Reader, store: StoreDep, letter_id: LetterId) -> dict[str, Any]:
    row = store.dead_letter_by_id(letter_id)
    if row is None:
        raise HTTPException(404, f"no dead letter {letter_id}")
    return dead_letter_detail(row)


@router.post(
    "/dead-letters/{letter_id:int}/replay", responses=_errors(400, 403, 404, 409, 413, 502)
)
def replay_one(
    who: Operator, actions: Actions, letter_id: LetterId, body: ReplayOne | None = None
) -> dict[str, Any]:
    return actions.replay_one(who, letter_id, body)


@router.post("/dead-letters/replay", status_code=202, responses=_errors(400, 403, 409, 413))
def replay_many(
    who: Operator, actions: Actions, body: ReplayMany, response: Response
) -> dict[str, Any]:
    """Start a replay job over the selection; it runs in the background (follow it at
    the `Location` answered, GET /api/v1/jobs/{job_id})."""
    started = actions.replay_many(who, body)
    response.headers["location"] = f"/api/v1/jobs/{started.job.id}"
    return {"job": replay_job_view(started.job), "remaining": started.remaining}


@router.delete("/dead-letters/{letter_id:int}", responses=_errors(403, 404))
def delete_one(who: Operator, actions: Actions, letter_id: LetterId) -> dict[str, Any]:
    return actions.delete_one(who, letter_id)


@router.post("/dead-letters/delete", responses=_errors(400, 403, 413))
def delete_many(who: Operator, actions: Actions, body: Selection) -> dict[str, Any]:
    return actions.delete_many(who, body)


# ------------------------------------------------------------------ pending retries


@router.get("/pending", responses=_errors(400), openapi_extra=READ)
def list_pending(
    who: Reader, ops: Ops, flt: Pending, limit: Limit = 50, cursor: Cursor = None
) -> dict[str, Any]:
    rows, nxt = ops.pending(flt, limit=limit, cursor=cursor)
    return {"items": [pending_view(r, full=False) for r in rows], "next_cursor": nxt}


@router.get("/pending/{pending_id:int}", responses=_errors(404), openapi_extra=READ)
def get_pending(who: Reader, store: StoreDep, pending_id: PendingId) -> dict[str, Any]:
    row = store.pending_by_id(pending_id)
    if row is None:
        raise HTTPException(404, f"no pending retry {pending_id} (delivered or cancelled?)")
    return pending_view(row, full=True)


@router.get("/pending/{pending_id:int}/queue", responses=_errors(400, 404), openapi_extra=READ)
def get_pending_queue(
    who: Reader, ops: Ops, pending_id: PendingId, limit: Limit = 50, cursor: Cursor = None
) -> dict[str, Any]:
    """The key queue a pending retry is in (``ordering="key"``), head first: the order
    the service delivers it in: the head with the rows behind it, in runs."""
    found = ops.pending_queue(pending_id, limit=limit, cursor=cursor)
    if found is None:
        raise HTTPException(404, f"no pending retry {pending_id} (delivered or cancelled?)")
    row, rows, nxt = found
    if row.order_queue is None:
        raise HTTPException(404, f"pending retry {pending_id} keeps no key order (no queue)")
    return {
        "id": row.id,
        "order_state": order_state(row),
        "queue": queue_view(row),
        "items": [queue_item(r) for r in rows],
        "next_cursor": nxt,
    }


@router.post("/pending/{pending_id:int}/retry-now", responses=_errors(403, 404, 409))
def retry_now(who: Operator, actions: Actions, pending_id: PendingId) -> dict[str, Any]:
    return actions.retry_now(who, pending_id)


@router.post("/pending/{pending_id:int}/cancel", responses=_errors(403, 404))
def cancel(who: Operator, actions: Actions, pending_id: PendingId) -> dict[str, Any]:
    return actions.cancel(who, pending_id)


# ------------------------------------------------------------------ a record's story


class RecordQueryParams(RecordQuery):
    model_config = ConfigDict(extra="ignore")


def _record_query(query: Annotated[RecordQueryParams, Query()]) -> RecordQuery:
    return RecordQuery(**query.model_dump())


@router.get("/records", responses=_errors(400), openapi_extra=READ)
def find_records(
    who: Reader, ops: Ops, q: Annotated[RecordQuery, Depends(_record_query)]
) -> dict[str, Any]:
    """Where is my record? Its story, from its first failure through each retry to its
    delivery or dead letter, from pending retries, delivered ones kept as history
    (`history_retention_days`) and dead letters."""
    if (problem := q.problem()) is not None:
        raise HTTPException(400, problem)
    found = ops.find_records(
        key=q.key_bytes(), topic=q.topic, partition=q.partition, offset=q.offset
    )
    return {"records": [story_view(s) for s in found]}


# ------------------------------------------------------------------ replay jobs


@router.get("/jobs", responses=_errors(400), openapi_extra=READ)
def list_jobs(who: Reader, ops: Ops, limit: Limit = 50, cursor: Cursor = None) -> dict[str, Any]:
    rows, nxt = ops.replay_jobs(limit=limit, cursor=cursor)
    return {"items": [replay_job_view(r) for r in rows], "next_cursor": nxt}


@router.get("/jobs/{job_id:int}", responses=_errors(404), openapi_extra=READ)
def get_job(who: Reader, store: StoreDep, job_id: JobId) -> dict[str, Any]:
    job = store.replay_jobs.get(job_id, with_failures=True)
    if job is None:
        raise HTTPException(404, f"no replay job {job_id}")
    return replay_job_view(job)


@router.post("/jobs/{job_id:int}/cancel", responses=_errors(403, 404, 409))
def cancel_job(who: Operator, actions: Actions, job_id: JobId) -> dict[str, Any]:
    """Stop a running job: the letters it has not sent stay dead letters."""
    return replay_job_view(actions.cancel_replay_job(who, job_id))


# ------------------------------------------------------------------ stats, audit


@router.get("/stats", openapi_extra=READ)
def stats(who: Reader, store: StoreDep) -> dict[str, Any]:
    return store.totals()


@router.get("/stats/rates", openapi_extra=READ)
def rates(
    who: Reader, store: StoreDep, minutes: Annotated[int, Query(ge=1, le=1440)] = 60
) -> dict[str, Any]:
    return {"minutes": minutes, "series": store.rates(minutes)}


@router.get("/audit", responses=_errors(400), openapi_extra=READ)
def audit(
    who: Reader, ops: Ops, flt: Audit, limit: Limit = 50, cursor: Cursor = None
) -> dict[str, Any]:
    """Who did what to which messages, newest first; every filter given must match."""
    rows, nxt = ops.audit_log(flt, limit=limit, cursor=cursor)
    return {"items": [audit_entry(r) for r in rows], "next_cursor": nxt}
