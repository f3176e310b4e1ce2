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

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import StreamingResponse

from redrive.service.actions import (
    ActionRefused,
    OperatorActions,
    ReplayMany,
    ReplayOne,
    Selection,
)
from redrive.service.auth import ANONYMOUS, Principal
from redrive.service.filters import DeadLetterFilter, FilterError, PendingFilter

if TYPE_CHECKING:
    from redrive.service.service import RetryService

HEX_PREVIEW_BYTES = 64 * 1024


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
        with contextlib.suppress(ValueError):
            out["json"] = json.loads(out["text"])
    out["hex"] = raw[:HEX_PREVIEW_BYTES].hex()
    out["hex_truncated"] = len(raw) > HEX_PREVIEW_BYTES
    return out


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


def create_router(service: "RetryService") -> APIRouter:
    router = APIRouter(prefix="/api/v1")
    ops = service.operations
    actions = OperatorActions(service)
    settings = service.settings

    def principal(request: Request) -> Principal:
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

    def dl_filter(
        topic: str | None = None,
        group: str | None = None,
        error_type: str | None = None,
        text: str | None = None,
        reason: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> DeadLetterFilter:
        try:
            return DeadLetterFilter(
                topic=topic,
                group=group,
                error_type=error_type,
                text=text,
                reason=reason,
                since=since,
                until=until,
            )
        except ValueError as exc:
            raise HTTPException(422, f"bad filter: {exc}") from None

    Filter = Annotated[DeadLetterFilter, Depends(dl_filter)]  # noqa: N806 - a type alias
    Limit = Annotated[int, Query(ge=1, le=500)]  # noqa: N806 - a type alias

    def paged(call: Any) -> Any:
        try:
            return call()
        except FilterError as exc:
            raise HTTPException(400, str(exc)) from None

    @router.get("/whoami")
    def whoami(who: Annotated[Principal, Depends(principal)]) -> dict[str, str]:
        return {"name": who.name, "role": who.role}

    # -------------------------------------------------------------- dead letters

    @router.get("/dead-letters")
    def list_dead_letters(
        who: Reader, flt: Filter, limit: Limit = 50, cursor: str | None = None
    ) -> dict[str, Any]:
        rows, nxt = paged(lambda: ops.dead_letters(flt, limit=limit, cursor=cursor))
        return {"items": [dead_letter_summary(r) for r in rows], "next_cursor": nxt}

    @router.get("/dead-letters/export")
    def export_dead_letters(who: Reader, flt: Filter) -> StreamingResponse:
        def lines() -> Iterator[bytes]:
            cursor = None
            while True:
                rows, cursor = ops.dead_letters(flt, limit=500, cursor=cursor)
                for row in rows:
                    yield (json.dumps(dead_letter_detail(row), default=str) + "\n").encode()
                if cursor is None:
                    return

        return StreamingResponse(
            lines(),
            media_type="application/x-ndjson",
            headers={"content-disposition": 'attachment; filename="dead-letters.jsonl"'},
        )

    @router.get("/dead-letters/{letter_id}")
    def get_dead_letter(who: Reader, letter_id: int) -> dict[str, Any]:
        row = ops.dead_letter(letter_id)
        if row is None:
            raise HTTPException(404, f"no dead letter {letter_id}")
        return dead_letter_detail(row)

    def refusals_as_http(call: Any) -> Any:
        try:
            return call()
        except ActionRefused as exc:
            raise HTTPException(exc.status, exc.detail) from None

    @router.post("/dead-letters/{letter_id}/replay")
    def replay_one(who: Operator, letter_id: int, body: ReplayOne | None = None) -> dict[str, Any]:
        return refusals_as_http(lambda: actions.replay_one(who, letter_id, body))  # type: ignore[no-any-return]

    @router.post("/dead-letters/replay")
    def replay_many(who: Operator, body: ReplayMany) -> dict[str, Any]:
        return refusals_as_http(lambda: actions.replay_many(who, body))  # type: ignore[no-any-return]

    @router.delete("/dead-letters/{letter_id}")
    def delete_one(who: Operator, letter_id: int) -> dict[str, Any]:
        return refusals_as_http(lambda: actions.delete_one(who, letter_id))  # type: ignore[no-any-return]

    @router.post("/dead-letters/delete")
    def delete_many(who: Operator, body: Selection) -> dict[str, Any]:
        return refusals_as_http(lambda: actions.delete_many(who, body))  # type: ignore[no-any-return]

    # -------------------------------------------------------------- pending retries

    @router.get("/pending")
    def list_pending(
        who: Reader,
        destination: str | None = None,
        group: str | None = None,
        due_after_ms: Annotated[int | None, Query(ge=0)] = None,
        due_before_ms: Annotated[int | None, Query(ge=0)] = None,
        limit: Limit = 50,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        flt = PendingFilter(
            destination=destination,
            group=group,
            due_after_ms=due_after_ms,
            due_before_ms=due_before_ms,
        )
        rows, nxt = paged(lambda: ops.pending(flt, limit=limit, cursor=cursor))
        return {"items": [pending_view(r, full=False) for r in rows], "next_cursor": nxt}

    @router.get("/pending/{pending_id}")
    def get_pending(who: Reader, pending_id: int) -> dict[str, Any]:
        row = ops.pending_one(pending_id)
        if row is None:
            raise HTTPException(404, f"no pending retry {pending_id} (delivered or cancelled?)")
        return pending_view(row, full=True)

    @router.post("/pending/{pending_id}/retry-now")
    def retry_now(who: Operator, pending_id: int) -> dict[str, Any]:
        return refusals_as_http(lambda: actions.retry_now(who, pending_id))  # type: ignore[no-any-return]

    @router.post("/pending/{pending_id}/cancel")
    def cancel(who: Operator, pending_id: int) -> dict[str, Any]:
        return refusals_as_http(lambda: actions.cancel(who, pending_id))  # type: ignore[no-any-return]

    # -------------------------------------------------------------- stats, audit

    @router.get("/stats")
    def stats(who: Reader) -> dict[str, Any]:
        return ops.stats()

    @router.get("/stats/rates")
    def rates(who: Reader, minutes: Annotated[int, Query(ge=1, le=1440)] = 60) -> dict[str, Any]:
        return {"minutes": minutes, "series": ops.rates(minutes)}

    @router.get("/audit")
    def audit(who: Reader, limit: Limit = 50, cursor: str | None = None) -> dict[str, Any]:
        rows, nxt = paged(lambda: ops.audit_log(limit=limit, cursor=cursor))
        items = [{**r, "at": _time(r["at"]), "ids": list(r["ids"])} for r in rows]
        return {"items": items, "next_cursor": nxt}

    return router
