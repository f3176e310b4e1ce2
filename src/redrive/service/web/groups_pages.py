"""The web UI's error groups: the groups page, a group's page (its letters, the mute
button, and the replay and delete of the whole group, which open the bulk previews
with the group as their filter: :mod:`.replay_forms`, :mod:`.delete_preview`), and
the form that moves a letter to another group (on a letter's page).

Pages read as the other pages do (:mod:`.pages`: `Reader`); the forms are checked as
every action form is (:func:`.forms.form_action`: CSRF, then an operator session)
and call the group actions (:mod:`redrive.service.group_actions`) the REST API calls,
which write the audit log.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import ValidationError

from redrive.service.filters import DeadLetterFilter, FilterError
from redrive.service.fingerprints import FINGERPRINT_PATTERN
from redrive.service.group_actions import GroupActions, GroupMove
from redrive.service.operations import Operations
from redrive.service.store import ErrorGroup
from redrive.service.web.deps import Ops, PagesDep, StoreDep
from redrive.service.web.forms import Posted, form_action
from redrive.service.web.groups_api import error_group_view
from redrive.service.web.pages import PAGE_SIZE, Reader
from redrive.service.web.params import (
    REFUSALS,
    explain,
    field,
    here,
    local_url,
    query,
)
from redrive.service.web.representations import dead_letter_summary
from redrive.service.web.sparklines import sparkline

router = APIRouter(include_in_schema=False)

_GROUP = re.compile(FINGERPRINT_PATTERN)
ORDERS = {"count": "most letters", "last_seen": "latest"}


def _shown(group: ErrorGroup) -> dict[str, Any]:
    return {**error_group_view(group), "spark": sparkline(group.hourly)}


@router.get("/error-groups", response_class=HTMLResponse)
def error_groups(request: Request, who: Reader, pages: PagesDep, store: StoreDep) -> Response:
    q = request.query_params
    order = field(q, "order") if field(q, "order") in ORDERS else "count"
    topic = field(q, "topic")
    muted = {"yes": True, "no": False}.get(field(q, "muted"))
    error = None
    rows: list[dict[str, Any]] = []
    if "\x00" in topic or len(topic) > 249:
        error = "topic: not a topic name"
    else:
        found = store.error_groups(order=order, topic=topic or None, muted=muted, limit=200)
        rows = [_shown(g) for g in found]
    return pages.render(
        request,
        "error_groups.html",
        who,
        nav="error-groups",
        rows=rows,
        order=order,
        orders=ORDERS,
        topic=topic,
        muted=field(q, "muted"),
        error=error,
        suggest=pages.suggestions(),
    )


@router.get("/error-groups/{error_group}", response_class=HTMLResponse)
def error_group(
    request: Request, error_group: str, who: Reader, pages: PagesDep, store: StoreDep, ops: Ops
) -> Response:
    found = store.error_group(error_group) if _GROUP.match(error_group) else None
    if found is None:
        return pages.error(
            request,
            who,
            404,
            "Not found",
            f"Error group {error_group[:40]} has no dead letters: they were replayed or "
            "deleted, or there is no such group.",
            back="/error-groups",
        )
    cursor = field(request.query_params, "cursor")
    error, rows, next_cursor = None, [], None
    try:
        letters, next_cursor = ops.dead_letters(
            DeadLetterFilter(error_group=error_group), limit=PAGE_SIZE, cursor=cursor or None
        )
        rows = [dead_letter_summary(r) for r in letters]
    except FilterError as exc:
        error = str(exc)
    this_page = here(request)
    base = f"/error-groups/{error_group}"
    return pages.render(
        request,
        "error_group.html",
        who,
        nav="error-groups",
        g=_shown(found),
        rows=rows,
        error=error,
        back=this_page,
        back_q=quote(this_page, safe=""),
        first_page=bool(cursor),
        first_url=base,
        next_url=base + query(cursor=next_cursor) if next_cursor else None,
    )


def _actions(p: Posted) -> GroupActions:
    # Operations is the store's operator side, nothing of its own: one per form is free.
    return GroupActions(p.store, Operations(p.store), p.actions)


def _group_of(p: Posted) -> str | None:
    group = str(p.request.path_params["error_group"])
    return group if _GROUP.match(group) else None


def _mute(p: Posted, muted: bool) -> Response:
    group = _group_of(p)
    verb = "Mute" if muted else "Unmute"
    if group is None:
        return p.redirect("/error-groups", "error", f"{verb} refused: no such error group.")
    back = local_url(p.field("back"), f"/error-groups/{group}", "/error-groups")
    try:
        _actions(p).mute(p.who, group, muted=muted)
    except REFUSALS as exc:
        return p.redirect(back, "error", f"{verb} refused: {explain(exc)}")
    said = "muted: no surge alert for it" if muted else "unmuted"
    return p.redirect(back, "ok", f"Error group {group} {said}.")


@form_action("/error-groups/{error_group}/mute")
def mute_group(p: Posted) -> Response:
    return _mute(p, True)


@form_action("/error-groups/{error_group}/unmute")
def unmute_group(p: Posted) -> Response:
    return _mute(p, False)


@form_action("/dead-letters/{letter_id:int}/move")
def move_letter(p: Posted) -> Response:
    letter_id = p.path_id("letter_id")
    back = local_url(p.field("back"), "/dead-letters", "/dead-letters")
    here_url = f"/dead-letters/{letter_id}" + query(back=back)
    try:
        body = GroupMove(error_group=p.field("error_group"))
        result = _actions(p).move(p.who, letter_id, body)
    except ValidationError:
        return p.redirect(here_url, "error", "Move refused: a group is 16 hex digits.")
    except REFUSALS as exc:
        return p.redirect(here_url, "error", f"Move refused: {explain(exc)}")
    to = result["error_group"]
    return p.redirect(here_url, "ok", f"Dead letter {letter_id} moved to error group {to}.")
