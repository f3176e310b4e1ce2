"""The web UI's replay job pages (GET): the jobs, one job, and its progress as JSON,
which the job page polls. A job is shown as the API has it (`replay_job_view`), with
its selection in words and a link that searches the letters it left."""

import contextlib
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from redrive.service.filters import INT64_MAX, FilterError
from redrive.service.store import ReplayJob, Store
from redrive.service.web import session
from redrive.service.web.deps import Ops, PagesDep, StoreDep
from redrive.service.web.pages import PAGE_SIZE, Reader
from redrive.service.web.params import described_in, explain, field, plural, query
from redrive.service.web.representations import replay_job_view

router = APIRouter(include_in_schema=False)


def per_second(rate: float) -> str:
    return f"{rate:,g}/s"


def job_summary(job: dict[str, Any]) -> str:
    """How far a job got, in one line: "1,234 of 5,000 · sent 1,230 · failed 4"."""
    text = f"{job['settled']:,} of {job['total']:,}"
    text += f" · sent {job['sent']:,} · failed {job['failed']:,}"
    for name in ("gone", "cancelled", "skipped"):
        if job[name]:
            text += f" · {name} {job[name]:,}"
    return text


def _filter_fields(flt: dict[str, Any]) -> dict[str, str]:
    """A stored filter as the search form's fields (times as its UTC inputs take them)."""
    raw = {}
    for name, value in flt.items():
        if value is None:
            continue
        text = str(value)
        if name in ("since", "until"):
            with contextlib.suppress(ValueError):
                at = datetime.fromisoformat(text)
                at = at.astimezone(UTC) if at.tzinfo else at
                text = at.strftime("%Y-%m-%dT%H:%M:%S")
        raw[name] = text
    return raw


def _job(row: ReplayJob, store: Store) -> dict[str, Any]:
    """A job as the pages show it: the API's view, with its selection in words."""
    job = replay_job_view(row)
    flt = job["filter"]
    raw = _filter_fields(flt or {})
    if flt is None:
        selection = f"{plural(job['total'], 'dead letter')} chosen by id"
    else:
        selection = described_in(store, raw) or "every dead letter"
    return {
        **job,
        "summary": job_summary(job),
        "selection": selection,
        # The letters it left (failed, cancelled, or kept) are found by the same search.
        "search_url": "/dead-letters" + query(**raw) if flt is not None else None,
        "rate_text": per_second(job["rate"]),
        # The bar shows the letters the job went through: a cancelled job's cancelled
        # letters were never tried, so it ends where the job stopped, not full.
        "worked": job["settled"] - job["cancelled"],
        "percent": round((job["settled"] - job["cancelled"]) * 100 / job["total"])
        if job["total"]
        else 100,
    }


def _replay_job(store: Store, job_id: int) -> ReplayJob | None:
    # A bigserial id; anything else is no job (PostgreSQL would refuse it).
    if not 1 <= job_id <= INT64_MAX:
        return None
    return store.replay_jobs.get(job_id, with_failures=True)


@router.get("/jobs", response_class=HTMLResponse)
def jobs(request: Request, who: Reader, pages: PagesDep, ops: Ops, store: StoreDep) -> Response:
    cursor = field(request.query_params, "cursor")
    error, rows, next_cursor = None, [], None
    try:
        found, next_cursor = ops.replay_jobs(limit=PAGE_SIZE, cursor=cursor or None)
        rows = [_job(r, store) for r in found]
    except FilterError as exc:
        error = explain(exc)
    return pages.render(
        request,
        "jobs.html",
        who,
        nav="jobs",
        rows=rows,
        error=error,
        first_page=bool(cursor),
        next_url="/jobs" + query(cursor=next_cursor) if next_cursor else None,
        first_url="/jobs",
    )


@router.get("/jobs/{job_id:int}", response_class=HTMLResponse)
def job(request: Request, job_id: int, who: Reader, pages: PagesDep, store: StoreDep) -> Response:
    row = _replay_job(store, job_id)
    if row is None:
        text = f"Replay job {job_id} does not exist."
        return pages.error(request, who, 404, "Not found", text, back="/jobs")
    return pages.render(request, "job.html", who, nav="jobs", job=_job(row, store))


@router.get("/jobs/{job_id:int}.json")
def job_progress(job_id: int, who: Reader, store: StoreDep) -> Response:
    """The job page's live progress (ui.js polls it). Not the API's GET /api/v1/jobs/{id}:
    that takes bearer tokens only, and a page's script has the session cookie."""
    row = _replay_job(store, job_id)
    if row is None:
        return JSONResponse(
            {"detail": f"no replay job {job_id}"}, 404, headers=session.SECURITY_HEADERS
        )
    return JSONResponse(_job(row, store), headers=session.SECURITY_HEADERS)
