"""The web UI's audit page: who did what to which messages, newest first, searched by
who, what, which dead letter and when.

Its form takes its fields from :class:`~redrive.service.filters.AuditFilter`, the
model ``GET /api/v1/audit`` takes, so the page and the API search alike; a bad value
is shown on the page, not refused with an error page.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from redrive.service.filters import AuditFilter, FilterError
from redrive.service.store import AuditRecord
from redrive.service.web.deps import Ops, PagesDep
from redrive.service.web.pages import PAGE_SIZE, Reader
from redrive.service.web.params import FILTER_LABELS, field, form_filter, query

router = APIRouter(include_in_schema=False)

# The actions the service records, offered as suggestions by the form.
ACTIONS = (
    "replay",
    "edit-and-replay",
    "replay-dry-run",
    "replay-job",
    "schedule-replay-job",
    "cancel-replay-job",
    "delete",
    "retry-now",
    "cancel",
    "mute-group",
    "unmute-group",
    "move-to-group",
)
SHOWN_IDS = 10


def _entry(row: AuditRecord) -> dict[str, Any]:
    asked = {k: v for k, v in (row.filter or {}).items() if v is not None}
    selection = ", ".join(f"{FILTER_LABELS.get(k, k)} {v!r}" for k, v in asked.items())
    return {
        "id": row.id,
        "at": row.at,
        "actor": row.actor,
        "role": row.role,
        "action": row.action,
        "count": row.count,
        "ids": row.ids[:SHOWN_IDS],
        "more_ids": max(0, len(row.ids) - SHOWN_IDS),
        "selection": selection or None,
        "detail": json.dumps(row.detail, sort_keys=True) if row.detail else None,
    }


@router.get("/audit", response_class=HTMLResponse)
def audit_page(request: Request, who: Reader, pages: PagesDep, ops: Ops) -> Response:
    cursor = field(request.query_params, "cursor")
    error, rows, next_cursor = None, [], None
    raw = {name: field(request.query_params, name) for name in AuditFilter.model_fields}
    try:
        flt, raw = form_filter(AuditFilter, request.query_params)
        found, next_cursor = ops.audit_log(flt, limit=PAGE_SIZE, cursor=cursor or None)
        rows = [_entry(r) for r in found]
    except (ValueError, FilterError) as exc:
        error = str(exc)
    given = {k: v for k, v in raw.items() if v}
    return pages.render(
        request,
        "audit.html",
        who,
        nav="audit",
        rows=rows,
        raw=raw,
        labels={n: f.title or n for n, f in AuditFilter.model_fields.items()},
        filtered=bool(given),
        error=error,
        actions=ACTIONS,
        first_page=bool(cursor),
        first_url="/audit" + query(**given),
        next_url="/audit" + query(**given, cursor=next_cursor) if next_cursor else None,
    )
