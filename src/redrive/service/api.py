"""The REST API under /api/v1: dead letters, pending retries, stats, the audit log.

(No postponed annotations here: FastAPI must see the dependency aliases defined
inside create_router, which string annotations would hide from it.)

Reads are open to anyone who can reach the port unless `require_token_for_reads`
is set (then a viewer token is needed); every mutation needs an operator token
(`Authorization: Bearer rdv_...`) and is written to the audit log.
"""

import base64
import contextlib
import json
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Security
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict

from redrive.service.actions import (
    ActionRefused,
    OperatorActions,
    ReplayMany,
    ReplayOne,
    Selection,
)
from redrive.service.auth import ANONYMOUS, Principal
from redrive.service.filters import (
    CURSOR_MAX_LENGTH,
    CURSOR_PATTERN,
    INT64_MAX,
    DeadLetterFilter,
    FilterError,
    PendingFilter,
)

if TYPE_CHECKING:
    from redrive.service.service import RetryService

HEX_PREVIEW_BYTES = 64 * 1024
# A payload's JSON is shown parsed only up to this nesting: responses are serialized
# by pydantic, which refuses values nested deeper than about 250 levels; the text,
# hex and base64 forms still carry the payload.
MAX_JSON_NESTING = 100
NDJSON = "application/x-ndjson"


# ------------------------------------------------------------------ what the API answers


class ErrorBody(BaseModel):
    """Every refusal: a sentence saying what is wrong (for 422, naming the field)."""

    detail: str


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for refusals, so the document lists every status a route answers."""
    what = {
        400: "Refused: a cursor this API did not return, a destination that is not "
        "allowed, or a body that is not JSON",
        401: "No token, an unknown or revoked one, or a malformed Authorization header",
        403: "The token's role may not do this (operator needed)",
        404: "No such dead letter or pending retry",
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


# Ids are bigserial: positive bigints (the `int` path convertor keeps a word such as
# `replay` or `export` from matching an id route).
LetterId = Annotated[int, Path(ge=1, le=INT64_MAX)]
PendingId = Annotated[int, Path(ge=1, le=INT64_MAX)]
Cursor = Annotated[
    str | None,
    Query(
        max_length=CURSOR_MAX_LENGTH,
        pattern=CURSOR_PATTERN,
        description="The `next_cursor` of the previous page.",
    ),
]


# ------------------------------------------------------------------ representations


def render_bytes(raw: bytes | None) -> dict[str, Any] | None:
    """A payload as an operator wants to see it: text, JSON, hex, base64."""
    if raw is None:
        return None
    out: dict[str, Any] = {"size": len(raw), "base64": base64.b64encode(raw).decode()}
    try:
        out["text"] = raw.decode("utf-8")
    except UnicodeDecodeError:
        out["text"] = None
    out["json"] = None
    if out["text"] is not None:
        # RecursionError: nesting deeper than the parser's stack (a producer can send it).
        with contextlib.suppress(ValueError, RecursionError):
            parsed = json.loads(out["text"])
            if _nesting(parsed) <= MAX_JSON_NESTING:
                out["json"] = parsed
    out["hex"] = raw[:HEX_PREVIEW_BYTES].hex()
    out["hex_truncated"] = len(raw) > HEX_PREVIEW_BYTES
    return out


def _nesting(value: Any) -> int:
    """How deeply arrays and objects nest in a parsed JSON value (without recursion)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            depth += 1
            deepest = max(deepest, depth)
            stack += [
                (child, depth) for child in (item.values() if isinstance(item, dict) else item)
            ]
    return deepest


def render_headers(headers: list[tuple[str, bytes | None]]) -> list[dict[str, Any]]:
    out = []
    for name, value in headers:
        text = None
        if value is not None:
            try:
                text = value.decode("utf-8")
            except UnicodeDecodeError:
                text = None
        out.append(
            {
                "name": name,
                "text": text,
                "base64": None if value is None else base64.b64encode(value).decode(),
            }
        )
    return out


def _time(value: Any) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else None


def dead_letter_summary(row: dict[str, Any]) -> dict[str, Any]:
    key = row["msg_key"]
    return {
        "id": row["id"],
        "topic": row["topic"],
        "group": row["group_id"],
        "error_type": row["error_type"],
        "error_message": row["error_message"],
        "reason_code": row["reason_code"],
        "reason": row["reason"],
        "attempt": row["attempt"],
        "key": render_bytes(key)["text"] if key is not None else None,  # type: ignore[index]
        "dead_at": _time(row["dead_at"]),
    }


def dead_letter_detail(row: dict[str, Any]) -> dict[str, Any]:
    return {
        **dead_letter_summary(row),
        "key": render_bytes(row["msg_key"]),
        "value": render_bytes(row["msg_value"]),
        "headers": render_headers(row["headers"]),
        "error_trace": row["error_trace"],
        "source": row["source"],
        "original": {
            "topic": row["original_topic"],
            "partition": row["original_partition"],
            "offset": row["original_offset"],
            "timestamp": row["original_timestamp"],
        },
        "request": {
            "topic": row["request_topic"],
            "partition": row["request_partition"],
            "offset": row["request_offset"],
        },
    }


def pending_view(row: dict[str, Any], *, full: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": row["id"],
        "due_ms": row["due_ms"],
        "destination": row["destination"],
        "partition": row["dest_partition"],
        "attempt": row["attempt"],
        "group": row["group_id"],
        "deadline_ms": row["deadline_ms"],
        "received_at": _time(row["received_at"]),
    }
    if full:
        out |= {
            "key": render_bytes(row["msg_key"]),
            "value": render_bytes(row["msg_value"]),
            "headers": render_headers(row["headers"]),
            "original": {
                "topic": row["original_topic"],
                "partition": row["original_partition"],
                "offset": row["original_offset"],
            },
        }
    return out


# ------------------------------------------------------------------ the router


# Declares the bearer scheme in the OpenAPI document; `principal` reads the header
# itself, so that a malformed one is refused rather than taken as no token.
_BEARER = HTTPBearer(auto_error=False, description="An API token: `redrive token create`.")


def create_router(service: "RetryService") -> APIRouter:
    router = APIRouter(prefix="/api/v1", responses=_errors(401))
    ops = service.operations
    actions = OperatorActions(service)
    settings = service.settings
    # Reads without a token are allowed unless require_token_for_reads: the document
    # says so with an empty (optional) security requirement next to the bearer one.
    read_security: dict[str, Any] = {} if settings.require_token_for_reads else {"security": [{}]}

    def principal(
        request: Request,
        _declared: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)],
    ) -> Principal:
        header = request.headers.get("authorization", "")
        if not header:
            return ANONYMOUS
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise HTTPException(401, "Authorization must be 'Bearer <token>'")
        found = service.tokens.verify(token.strip())
        if found is None:
            raise HTTPException(401, "unknown or revoked token")
        return found

    def reader(who: Annotated[Principal, Depends(principal)]) -> Principal:
        if settings.require_token_for_reads and not who.may("viewer"):
            raise HTTPException(401, "a viewer or operator token is required")
        return who

    def operator(who: Annotated[Principal, Depends(principal)]) -> Principal:
        if who is ANONYMOUS:
            raise HTTPException(401, "this action needs an operator token (Authorization: Bearer)")
        if not who.may("operator"):
            raise HTTPException(403, f"token {who.name!r} has role {who.role}; operator needed")
        return who

    Reader = Annotated[Principal, Depends(reader)]  # noqa: N806 - a type alias
    Operator = Annotated[Principal, Depends(operator)]  # noqa: N806 - a type alias

    # The filters are validated by their models, as query parameters, before the
    # handler runs: a value PostgreSQL would refuse is a 422 naming the field.
    def dl_filter(query: Annotated[DeadLetterQuery, Query()]) -> DeadLetterFilter:
        return DeadLetterFilter(**query.model_dump())

    def pending_filter(query: Annotated[PendingQuery, Query()]) -> PendingFilter:
        return PendingFilter(**query.model_dump())

    Filter = Annotated[DeadLetterFilter, Depends(dl_filter)]  # noqa: N806 - a type alias
    Pending = Annotated[PendingFilter, Depends(pending_filter)]  # noqa: N806 - a type alias
    Limit = Annotated[int, Query(ge=1, le=500)]  # noqa: N806 - a type alias

    def paged(call: Any) -> Any:
        try:
            return call()
        except FilterError as exc:
            raise HTTPException(400, str(exc)) from None

    @router.get("/whoami", openapi_extra=read_security)
    def whoami(who: Reader) -> dict[str, str]:
        return {"name": who.name, "role": who.role}

    # -------------------------------------------------------------- dead letters

    @router.get("/dead-letters", responses=_errors(400), openapi_extra=read_security)
    def list_dead_letters(
        who: Reader, flt: Filter, limit: Limit = 50, cursor: Cursor = None
    ) -> dict[str, Any]:
        rows, nxt = paged(lambda: ops.dead_letters(flt, limit=limit, cursor=cursor))
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
        openapi_extra=read_security,
    )
    def export_dead_letters(who: Reader, flt: Filter) -> NdjsonResponse:
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

    @router.get(
        "/dead-letters/{letter_id:int}", responses=_errors(404), openapi_extra=read_security
    )
    def get_dead_letter(who: Reader, letter_id: LetterId) -> dict[str, Any]:
        row = ops.dead_letter(letter_id)
        if row is None:
            raise HTTPException(404, f"no dead letter {letter_id}")
        return dead_letter_detail(row)

    def refusals_as_http(call: Any) -> Any:
        try:
            return call()
        except ActionRefused as exc:
            raise HTTPException(exc.status, exc.detail) from None

    @router.post("/dead-letters/{letter_id:int}/replay", responses=_errors(400, 403, 404, 413, 502))
    def replay_one(
        who: Operator, letter_id: LetterId, body: ReplayOne | None = None
    ) -> dict[str, Any]:
        return refusals_as_http(lambda: actions.replay_one(who, letter_id, body))  # type: ignore[no-any-return]

    @router.post("/dead-letters/replay", responses=_errors(400, 403, 413))
    def replay_many(who: Operator, body: ReplayMany) -> dict[str, Any]:
        return refusals_as_http(lambda: actions.replay_many(who, body))  # type: ignore[no-any-return]

    @router.delete("/dead-letters/{letter_id:int}", responses=_errors(403, 404))
    def delete_one(who: Operator, letter_id: LetterId) -> dict[str, Any]:
        return refusals_as_http(lambda: actions.delete_one(who, letter_id))  # type: ignore[no-any-return]

    @router.post("/dead-letters/delete", responses=_errors(400, 403, 413))
    def delete_many(who: Operator, body: Selection) -> dict[str, Any]:
        return refusals_as_http(lambda: actions.delete_many(who, body))  # type: ignore[no-any-return]

    # -------------------------------------------------------------- pending retries

    @router.get("/pending", responses=_errors(400), openapi_extra=read_security)
    def list_pending(
        who: Reader, flt: Pending, limit: Limit = 50, cursor: Cursor = None
    ) -> dict[str, Any]:
        rows, nxt = paged(lambda: ops.pending(flt, limit=limit, cursor=cursor))
        return {"items": [pending_view(r, full=False) for r in rows], "next_cursor": nxt}

    @router.get("/pending/{pending_id:int}", responses=_errors(404), openapi_extra=read_security)
    def get_pending(who: Reader, pending_id: PendingId) -> dict[str, Any]:
        row = ops.pending_one(pending_id)
        if row is None:
            raise HTTPException(404, f"no pending retry {pending_id} (delivered or cancelled?)")
        return pending_view(row, full=True)

    @router.post("/pending/{pending_id:int}/retry-now", responses=_errors(403, 404))
    def retry_now(who: Operator, pending_id: PendingId) -> dict[str, Any]:
        return refusals_as_http(lambda: actions.retry_now(who, pending_id))  # type: ignore[no-any-return]

    @router.post("/pending/{pending_id:int}/cancel", responses=_errors(403, 404))
    def cancel(who: Operator, pending_id: PendingId) -> dict[str, Any]:
        return refusals_as_http(lambda: actions.cancel(who, pending_id))  # type: ignore[no-any-return]

    # -------------------------------------------------------------- stats, audit

    @router.get("/stats", openapi_extra=read_security)
    def stats(who: Reader) -> dict[str, Any]:
        return ops.stats()

    @router.get("/stats/rates", openapi_extra=read_security)
    def rates(who: Reader, minutes: Annotated[int, Query(ge=1, le=1440)] = 60) -> dict[str, Any]:
        return {"minutes": minutes, "series": ops.rates(minutes)}

    @router.get("/audit", responses=_errors(400), openapi_extra=read_security)
    def audit(who: Reader, limit: Limit = 50, cursor: Cursor = None) -> dict[str, Any]:
        rows, nxt = paged(lambda: ops.audit_log(limit=limit, cursor=cursor))
        items = [{**r, "at": _time(r["at"]), "ids": list(r["ids"])} for r in rows]
        return {"items": items, "next_cursor": nxt}

    return router
