"""The web UI's pages (GET): the overview, pending retries, one key's queue of pending
retries, dead letters, one dead letter, a record's story (where is my record?),
and sign-in (replay jobs: job_pages.py, the audit log: audit_pages.py, error groups:
groups_pages.py). The forms they carry are handled in
forms.py.

Reads are open unless `require_token_for_reads`; then a visitor without a viewer or
operator session is sent to sign in (or, on a link from another site, which
SameSite=Strict sends without the cookie, to a page that reloads same-site).
"""

from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from redrive.headers import is_redrive_header
from redrive.service.auth import Principal
from redrive.service.filters import INT64_MAX, FilterError, PendingFilter, RecordQuery
from redrive.service.group_metrics import MAX_GROUPS, surging
from redrive.service.store import Pending, Store
from redrive.service.web import session
from redrive.service.web.charts import breakdown, chart
from redrive.service.web.deps import Ops, PagesDep, Settings, StoreDep, TokenBook
from redrive.service.web.formatting import payload_view
from redrive.service.web.params import (
    FILTER_FIELDS,
    dead_letter_filter,
    describe_filter,
    described_in,
    explain,
    field,
    here,
    local_url,
    query,
)
from redrive.service.web.representations import (
    dead_letter_detail,
    dead_letter_summary,
    order_state,
    pending_view,
    queue_item,
    queue_view,
    rounds_view,
    story_view,
)

PAGE_SIZE = 50

router = APIRouter(include_in_schema=False)


class PageRefused(Exception):
    """The visitor may not read: `response` is sent instead of the page."""

    def __init__(self, response: Response) -> None:
        super().__init__("refused")
        self.response = response


def page_refused(request: Request, exc: Exception) -> Response:
    """The app's handler for PageRefused."""
    assert isinstance(exc, PageRefused)
    return exc.response


def reader(request: Request, pages: PagesDep, tokens: TokenBook, settings: Settings) -> Principal:
    """The visitor, if they may read; else PageRefused with where to go instead."""
    who = session.signed_in(request, tokens)
    if who.may("viewer") or not settings.require_token_for_reads:
        return who
    if (
        not request.cookies.get(session.SESSION_COOKIE)
        and request.headers.get("sec-fetch-site") == "cross-site"
    ):
        # A link from another site: SameSite=Strict withheld the cookie; reload
        # same-site so that it is sent.
        raise PageRefused(pages.render(request, "reload.html", who))
    login = "/login" + query(next=here(request))
    raise PageRefused(RedirectResponse(login, status_code=303, headers=session.SECURITY_HEADERS))


Reader = Annotated[Principal, Depends(reader)]


def story_url(topic: str | None, partition: int | None, offset: int | None) -> str | None:
    """The story page of the record first consumed at these coordinates; None when
    they are not known (no topic or no offset: not one record)."""
    if topic is None or offset is None:
        return None
    part = None if partition is None else str(partition)
    return "/records" + query(topic=topic, partition=part, offset=str(offset))


def _with_story(row: Pending, shown: dict[str, Any]) -> dict[str, Any]:
    """A pending retry as shown, with its record's coordinates and story link."""
    topic, partition, offset = row.original_topic, row.original_partition, row.original_offset
    return {
        **shown,
        "original": {"topic": topic, "partition": partition, "offset": offset},
        "story_url": story_url(topic, partition, offset),
    }


@router.get("/", response_class=HTMLResponse)
def overview(request: Request, who: Reader, pages: PagesDep, store: StoreDep) -> Response:
    stats = pages.stats.get(fresh=True)
    series = store.rates(60)
    dead, pending = stats["dead_letters"], stats["pending"]
    return pages.render(
        request,
        "overview.html",
        who,
        nav="overview",
        dead_total=dead["total"],
        pending_total=pending["total"],
        retries=chart(series, "scheduled", "published"),
        deaths=chart(series, "dead_lettered"),
        by_topic=breakdown(dead["by_topic"], "/dead-letters?topic="),
        by_error=breakdown(dead["by_error_type"], "/dead-letters?error_type="),
        by_reason=breakdown(dead["by_reason"], "/dead-letters?reason="),
        by_group=breakdown(dead["by_group"], "/dead-letters?group="),
        by_destination=breakdown(pending["by_destination"], "/pending?destination="),
        surging=_surging(store),
    )


def _surging(store: Store) -> list[dict[str, Any]]:
    """The error groups surging now, by the alert rule's measure, with their titles."""
    shown = []
    for surge in store.error_group_surges(limit=MAX_GROUPS):
        group = store.error_group(surge.error_group) if surging(surge) else None
        if group is not None:
            shown.append({"surge": surge, "title": group.title})
    return shown


@router.get("/pending", response_class=HTMLResponse)
def pending(request: Request, who: Reader, pages: PagesDep, ops: Ops) -> Response:
    q = request.query_params
    destination, group, cursor = (field(q, n) for n in ("destination", "group", "cursor"))
    error, rows, next_cursor = None, [], None
    try:
        flt = PendingFilter(destination=destination or None, group=group or None)
        found, next_cursor = ops.pending(flt, limit=PAGE_SIZE, cursor=cursor or None)
        rows = [_with_story(r, pending_view(r, full=False)) for r in found]
    except (ValidationError, FilterError) as exc:
        error = explain(exc)
    return pages.render(
        request,
        "pending.html",
        who,
        nav="pending",
        rows=rows,
        error=error,
        destination=destination,
        group=group,
        filtered=bool(destination or group),
        total=pages.stats.get()["pending"]["total"],
        first_page=bool(cursor),
        next_url="/pending" + query(destination=destination, group=group, cursor=next_cursor)
        if next_cursor
        else None,
        first_url="/pending" + query(destination=destination, group=group),
        suggest=pages.suggestions(),
    )


@router.get("/pending/{pending_id:int}/queue", response_class=HTMLResponse)
def pending_queue(
    request: Request, pending_id: int, who: Reader, pages: PagesDep, ops: Ops
) -> Response:
    q = request.query_params
    back = local_url(q.get("back"), "/pending", "/pending")
    cursor = field(q, "cursor")
    error, found = None, None
    try:
        if 1 <= pending_id <= INT64_MAX:  # a bigserial id; anything else is no row
            found = ops.pending_queue(pending_id, limit=PAGE_SIZE, cursor=cursor or None)
    except FilterError as exc:
        error = explain(exc)
        found = ops.pending_queue(pending_id, limit=PAGE_SIZE)
    if found is None or found[0].order_queue is None:
        text = (
            f"Pending retry {pending_id} does not exist: it was delivered or cancelled."
            if found is None
            else f"Pending retry {pending_id} keeps no key order: it is in no queue."
        )
        return pages.error(request, who, 404, "Not found", text, back=back)
    row, rows, next_cursor = found
    this_page = f"/pending/{pending_id}/queue"
    return pages.render(
        request,
        "pending_queue.html",
        who,
        nav="pending",
        id=pending_id,
        this={"order_state": order_state(row)},
        queue=queue_view(row),
        rows=[_with_story(r, queue_item(r)) for r in rows],
        error=error,
        back=back,
        first_page=bool(cursor) and error is None,
        next_url=this_page + query(back=back, cursor=next_cursor) if next_cursor else None,
        first_url=this_page + query(back=back),
    )


@router.get("/dead-letters", response_class=HTMLResponse)
def dead_letters(
    request: Request, who: Reader, pages: PagesDep, ops: Ops, store: StoreDep
) -> Response:
    q = request.query_params
    cursor = field(q, "cursor")
    raw = {name: field(q, name) for name in FILTER_FIELDS}
    error, rows, next_cursor, matching = None, [], None, 0
    try:
        flt, raw = dead_letter_filter(q)
        found, next_cursor = ops.dead_letters(flt, limit=PAGE_SIZE, cursor=cursor or None)
        rows = [dead_letter_summary(r) for r in found]
        matching = store.count_dead_letters(flt)
    except (ValueError, FilterError) as exc:
        error = str(exc)
    filter_query = {k: v for k, v in raw.items() if v}
    this_page = here(request)
    return pages.render(
        request,
        "dead_letters.html",
        who,
        nav="dead-letters",
        rows=rows,
        raw=raw,
        error=error,
        matching=matching,
        filtered=bool(filter_query),
        described=described_in(store, raw) if error is None else describe_filter(raw),
        back=this_page,
        back_q=quote(this_page, safe=""),
        first_page=bool(cursor),
        next_url="/dead-letters" + query(**filter_query, cursor=next_cursor)
        if next_cursor
        else None,
        first_url="/dead-letters" + query(**filter_query),
        export_url="/api/v1/dead-letters/export" + query(**filter_query),
        suggest=pages.suggestions(),
        error_groups=[(g.error_group, g.title) for g in store.error_groups(limit=100)],
    )


@router.get("/dead-letters/{letter_id:int}", response_class=HTMLResponse)
def dead_letter(
    request: Request, letter_id: int, who: Reader, pages: PagesDep, store: StoreDep
) -> Response:
    back = local_url(request.query_params.get("back"), "/dead-letters", "/dead-letters")
    row = store.dead_letter_by_id(letter_id)
    if row is None:
        return pages.error(
            request,
            who,
            404,
            "Not found",
            f"Dead letter {letter_id} does not exist: it was replayed or deleted.",
            back=back,
        )
    detail = dead_letter_detail(row)
    headers: list[dict[str, Any]] = [
        {**h, "redrive": is_redrive_header(h["name"])} for h in detail["headers"]
    ]
    return pages.render(
        request,
        "dead_letter.html",
        who,
        nav="dead-letters",
        d=detail,
        key=payload_view(detail["key"]),
        value=payload_view(detail["value"]),
        headers=headers,
        user_headers=sum(1 for h in headers if not h["redrive"]),
        rounds=rounds_view(store.replay_rounds([letter_id]).get(letter_id, [])),
        story_url=story_url(
            detail["original"]["topic"],
            detail["original"]["partition"],
            detail["original"]["offset"],
        ),
        back=back,
        suggest=pages.suggestions(),
    )


# ------------------------------------------------------------------ a record's story

RECORD_FIELDS = ("key", "key_base64", "topic", "partition", "offset")
# A key longer than the search takes (RecordQuery) gets no "records with this key" link.
MAX_KEY_LINK_BYTES = 4096


def duration(ms: int) -> str:
    """A delay as people say it: "300 ms", "1.5 s", "2m 5s", "3h 10m", "2d 4h"."""
    if ms < 1000:
        return f"{ms:,} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}".removesuffix(".0") + " s"
    s = ms // 1000
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m {s}s" if s else f"{m}m"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h {m}m" if m else f"{h}h"
    d, h = divmod(h, 24)
    return f"{d:,}d {h}h" if h else f"{d:,}d"


def _key_view(rendered: dict[str, Any] | None) -> dict[str, Any]:
    """A record's key for the story's header, and the search for its key's records."""
    if rendered is None:
        return {"kind": "null", "url": None}
    size, text = rendered["size"], rendered["text"]
    url = None
    if 0 < size <= MAX_KEY_LINK_BYTES:
        url = "/records" + (
            query(key=text) if text is not None else query(key_base64=rendered["base64"])
        )
    if text is not None:
        return {"kind": "text", "text": text, "size": size, "url": url}
    return {"kind": "binary", "hex": rendered["hex"][:64], "size": size, "url": url}


def _story(found: dict[str, Any]) -> dict[str, Any]:
    """A record's story as the page tells it: the API's view, with its key for the
    header, each retry's delay in words, and where a waiting retry is listed."""
    story = story_view(found)
    events = story["events"]
    waiting = story["state"] == "pending" and events and events[-1]["event"] == "scheduled"
    for event in events:
        event["waiting"] = False
        if event["event"] == "scheduled":
            delay = event.get("delay_ms")
            event["delay_text"] = None if delay is None or delay <= 0 else duration(delay)
    if waiting:
        last = events[-1]
        last["waiting"] = True
        last["pending_url"] = (
            "/pending"
            + query(destination=story["destination"], group=story["group"])
            + f"#pending-{last['pending_id']}"
        )
    return {**story, "key": _key_view(story["key"])}


@router.get("/records", response_class=HTMLResponse)
def records(
    request: Request, who: Reader, pages: PagesDep, ops: Ops, settings: Settings
) -> Response:
    """Where is my record? Its story, found by its key or where it was first consumed."""
    q = request.query_params
    raw = {name: field(q, name) for name in RECORD_FIELDS}
    # A key is matched exactly, as typed (spaces too).
    key = q.get("key")
    raw["key"] = key if isinstance(key, str) and key.strip() else ""
    asked = {name: value for name, value in raw.items() if value}
    error, stories = None, None
    if asked:
        try:
            search = RecordQuery.model_validate(asked)
            if (problem := search.problem()) is not None:
                raise FilterError(problem)
            found = ops.find_records(
                key=search.key_bytes(),
                topic=search.topic,
                partition=search.partition,
                offset=search.offset,
            )
            stories = [_story(s) for s in found]
        except (ValidationError, FilterError) as exc:
            error = explain(exc)
    return pages.render(
        request,
        "records.html",
        who,
        nav="records",
        raw=raw,
        error=error,
        stories=stories,
        searched=bool(asked),
        retention_days=settings.history_retention_days,
        suggest=pages.suggestions(),
    )


# ------------------------------------------------------------------ replay jobs


# ------------------------------------------------------------------ sign in


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, pages: PagesDep, tokens: TokenBook) -> Response:
    who = session.signed_in(request, tokens)
    nxt = local_url(request.query_params.get("next"), "/")
    return pages.render(request, "login.html", who, nav="login", next=nxt, error=None)
