"""The web UI's forms (POST): operator actions (a bulk replay starts a replay job, whose
page follows it; a job can be cancelled), sign-in and sign-out.

Every action form is checked the same way before it runs (`form_action`): its CSRF
token (session.py), then that the session holds an operator token. It then calls the
operator action (actions.py) that the REST API calls too, so both replay, delete and
write the audit log the same way, and shows a refusal as a one-time message. Without
script, a form not yet confirmed gets a confirmation page first.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData

from redrive.service.actions import (
    OperatorActions,
    Payload,
    ReplayMany,
    ReplayOne,
    Selection,
)
from redrive.service.auth import ANONYMOUS, Principal, Tokens
from redrive.service.filters import INT64_MAX
from redrive.service.store import Store
from redrive.service.web import session
from redrive.service.web.deps import Actions, PagesDep, StoreDep, TokenBook
from redrive.service.web.job_pages import per_second
from redrive.service.web.params import (
    REFUSALS,
    confirmed,
    dead_letter_filter,
    described_in,
    explain,
    field,
    local_url,
    plural,
    query,
)
from redrive.service.web.replay_settings import replay_settings, settings_in_words
from redrive.service.web.templating import Pages

NEEDS_OPERATOR = "This action needs an operator token: sign in with an operator token."

router = APIRouter(include_in_schema=False)


@dataclass(frozen=True, slots=True)
class Posted:
    """A form that passed the checks: who sent it, and what its action may use."""

    request: Request
    form: FormData
    who: Principal
    pages: Pages
    actions: OperatorActions
    store: Store

    def field(self, name: str) -> str:
        return field(self.form, name)

    def path_id(self, name: str) -> int:
        return int(self.request.path_params[name])

    def redirect(self, url: str, kind: str, text: str) -> Response:
        return session.redirect(self.request, url, kind, text)

    def confirm(self, question: str, button: str, back: str, danger: bool = False) -> Response:
        return self.pages.confirm(self.request, self.who, self.form, question, button, back, danger)


FormAction = Callable[[Posted], Response]


def form_action(path: str) -> Callable[[FormAction], FormAction]:
    """Register a form action: CSRF check, operator check, then `fn` in a thread."""

    def register(fn: FormAction) -> FormAction:
        def checked(
            request: Request,
            form: FormData,
            pages: Pages,
            tokens: Tokens,
            actions: OperatorActions,
            store: Store,
        ) -> Response:
            who = session.signed_in(request, tokens)
            if not session.csrf_ok(request, form):
                return pages.error(
                    request,
                    who,
                    403,
                    "Form expired",
                    "This form was refused: its CSRF token is missing or does not match "
                    "(an old page, or a request from another site). Go back, reload the "
                    "page and try again.",
                )
            if not who.may("operator"):
                back = local_url(field(form, "back"), "/")
                return pages.error(
                    request, who, 403, "Operator token needed", NEEDS_OPERATOR, login_next=back
                )
            response = fn(Posted(request, form, who, pages, actions, store))
            pages.stats.clear()
            return response

        async def endpoint(
            request: Request,
            pages: PagesDep,
            tokens: TokenBook,
            actions: Actions,
            store: StoreDep,
        ) -> Response:
            form = await request.form()
            return await run_in_threadpool(checked, request, form, pages, tokens, actions, store)

        endpoint.__name__ = f"ui_{fn.__name__}"
        router.add_api_route(path, endpoint, methods=["POST"], response_class=HTMLResponse)
        return fn

    return register


# ------------------------------------------------------------------ pending retries


@form_action("/pending/{pending_id:int}/retry-now")
def retry_now(p: Posted) -> Response:
    pending_id = p.path_id("pending_id")
    back = local_url(p.field("back"), "/pending", "/pending")
    try:
        p.actions.retry_now(p.who, pending_id)
    except REFUSALS as exc:
        return p.redirect(back, "error", f"Retry now refused: {explain(exc)}")
    return p.redirect(back, "ok", f"Pending retry {pending_id} is due now.")


@form_action("/pending/{pending_id:int}/cancel")
def cancel(p: Posted) -> Response:
    pending_id = p.path_id("pending_id")
    back = local_url(p.field("back"), "/pending", "/pending")
    if not confirmed(p.form):
        question = (
            f"Cancel pending retry {pending_id}? It moves to the dead letters "
            "(reason: cancelled) instead of being delivered."
        )
        return p.confirm(question, "Cancel retry", back, danger=True)
    try:
        p.actions.cancel(p.who, pending_id)
    except REFUSALS as exc:
        return p.redirect(back, "error", f"Cancel refused: {explain(exc)}")
    return p.redirect(back, "ok", f"Pending retry {pending_id} cancelled: it is now a dead letter.")


# ------------------------------------------------------------------ dead letters

_BULK = ("replay:selected", "delete:selected", "replay:matching", "delete:matching")


@form_action("/dead-letters/bulk")
def bulk(p: Posted) -> Response:
    back = local_url(p.field("back"), "/dead-letters")
    op = p.field("op")
    if op not in _BULK:
        return p.redirect(back, "error", f"Unknown bulk action {op!r}.")
    verb, scope = op.split(":")
    try:
        body, what = selection_of(p, scope)
        settings = replay_settings(p.form) if verb == "replay" else {}
    except ValueError as exc:
        return p.redirect(back, "error", str(exc))
    body.update(settings)
    if not confirmed(p.form):
        if verb == "replay":
            question = (
                f"Replay {what}{settings_in_words(settings)}? A job sends them in the "
                "background, paced; each is deleted once the broker has it, unless kept."
            )
        else:
            question = f"Delete {what}? This cannot be undone."
        button = "Replay" if verb == "replay" else "Delete"
        return p.confirm(question, button, back, danger=verb == "delete")
    if verb == "replay":
        return _replay_many(p, body, back)
    try:
        selection = Selection(**body)
    except ValidationError as exc:
        return p.redirect(back, "error", explain(exc))
    try:
        result = p.actions.delete_many(p.who, selection)
    except REFUSALS as exc:
        return p.redirect(back, "error", f"Delete refused: {explain(exc)}")
    return p.redirect(back, "ok", f"Deleted {plural(result['deleted'], 'dead letter')}.")


def selection_of(p: Posted, scope: str) -> tuple[dict[str, Any], str]:
    """The dead letters a bulk form names (`selected` ids, or those `matching` its
    filter) as a request body, and in words; ValueError saying what is wrong."""
    if scope == "selected":
        try:
            ids = sorted({int(str(v)) for v in p.form.getlist("ids")})
        except ValueError:
            raise ValueError("The selection is not a list of ids.") from None
        if not ids:
            raise ValueError("Select dead letters first (x toggles a row).")
        return {"ids": ids}, f"the {plural(len(ids), 'selected dead letter')}"
    try:
        flt, raw = dead_letter_filter(p.form)
    except ValueError as exc:
        raise ValueError(f"Bad filter: {exc}") from None
    count = p.store.count_dead_letters(flt)
    described = described_in(p.store, raw)
    what = (
        f"all {plural(count, 'dead letter')} matching {described}"
        if described
        else f"every dead letter ({count:,})"
    )
    return {"filter": flt, "all": p.field("all") == "1"}, what


def _replay_many(p: Posted, body: dict[str, Any], back: str) -> Response:
    try:
        replay = ReplayMany(**body)
    except ValidationError as exc:
        return p.redirect(back, "error", explain(exc))
    try:
        started = p.actions.replay_many(p.who, replay)
    except REFUSALS as exc:
        return p.redirect(back, "error", f"Replay refused: {explain(exc)}")
    job = started.job
    begun = "started" if job.start_at is None or job.state != "scheduled" else "scheduled"
    text = (
        f"Replay job {job.id} {begun}: {plural(job.total, 'dead letter')} at {per_second(job.rate)}"
    )
    if begun == "scheduled" and job.start_at is not None:
        text += f", from {job.start_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    text += "."
    if job.skipped:
        text += f" {plural(job.skipped, 'dead letter')} skipped (the job says why)."
    if started.remaining:
        # Replaying again now would pick the letters this job still has to send.
        text += (
            f" {started.remaining:,} more match: replay again for the rest once this job is done."
        )
    return p.redirect(f"/jobs/{job.id}", "ok", text)


@form_action("/dead-letters/{letter_id:int}/replay")
def replay(p: Posted) -> Response:
    letter_id = p.path_id("letter_id")
    back = local_url(p.field("back"), "/dead-letters", "/dead-letters")
    here = f"/dead-letters/{letter_id}" + query(back=back)
    destination = p.field("destination") or None
    keep = p.field("keep") == "1"
    override = p.field("override_quarantine") == "1"
    edited = "value" in p.form
    value = None
    if edited:
        raw_value = p.form.get("value")
        value = raw_value if isinstance(raw_value, str) else ""
        row = p.store.dead_letter_by_id(letter_id)
        original = row.msg_value if row else None
        # Browsers send a textarea's line breaks as CRLF: keep the original's style.
        if original is None or b"\r\n" not in original:
            value = value.replace("\r\n", "\n")
    if not confirmed(p.form):
        target = destination or "its topic"
        verb = "Replay the edited value of" if edited else "Replay"
        question = f"{verb} dead letter {letter_id} to {target}?"
        if not keep:
            question += " It is deleted once the broker has it."
        if override:
            question += " It is quarantined: the override is recorded in the audit log."
        return p.confirm(question, "Replay", here)
    try:
        body = ReplayOne(
            destination=destination,
            keep=keep,
            override_quarantine=override,
            value=Payload(text=value) if value is not None else None,
        )
    except ValidationError as exc:
        return p.redirect(here, "error", explain(exc))
    try:
        p.actions.replay_one(p.who, letter_id, body)
    except REFUSALS as exc:
        return p.redirect(here, "error", f"Replay refused: {explain(exc)}")
    to = destination or "its topic"
    if keep:
        return p.redirect(here, "ok", f"Replayed dead letter {letter_id} to {to} (kept).")
    return p.redirect(back, "ok", f"Replayed dead letter {letter_id} to {to}.")


@form_action("/dead-letters/{letter_id:int}/delete")
def delete(p: Posted) -> Response:
    letter_id = p.path_id("letter_id")
    back = local_url(p.field("back"), "/dead-letters", "/dead-letters")
    if not confirmed(p.form):
        question = f"Delete dead letter {letter_id}? This cannot be undone."
        here = f"/dead-letters/{letter_id}" + query(back=back)
        return p.confirm(question, "Delete", here, danger=True)
    try:
        p.actions.delete_one(p.who, letter_id)
    except REFUSALS as exc:
        return p.redirect(back, "error", f"Delete refused: {explain(exc)}")
    return p.redirect(back, "ok", f"Deleted dead letter {letter_id}.")


# ------------------------------------------------------------------ replay jobs


@form_action("/jobs/{job_id:int}/cancel")
def cancel_job(p: Posted) -> Response:
    job_id = p.path_id("job_id")
    here = f"/jobs/{job_id}"
    if not 1 <= job_id <= INT64_MAX:  # a bigserial id; PostgreSQL would refuse it
        return p.redirect("/jobs", "error", f"Cancel refused: no replay job {job_id}")
    if not confirmed(p.form):
        question = (
            f"Cancel replay job {job_id}? The dead letters it has not sent yet stay dead letters."
        )
        return p.confirm(question, "Cancel job", here, danger=True)
    try:
        job = p.actions.cancel_replay_job(p.who, job_id)
    except REFUSALS as exc:
        return p.redirect(here, "error", f"Cancel refused: {explain(exc)}")
    unsent = plural(job.cancelled, "dead letter")
    return p.redirect(here, "ok", f"Replay job {job_id} cancelled: {unsent} not sent (kept).")


# ------------------------------------------------------------------ sign in and out


def _login(request: Request, form: FormData, pages: Pages, tokens: Tokens) -> Response:
    nxt = local_url(field(form, "next"), "/")
    if not session.csrf_ok(request, form):
        return pages.render(
            request,
            "login.html",
            ANONYMOUS,
            status=403,
            nav="login",
            next=nxt,
            error="The sign-in form expired (CSRF check failed). Please try again.",
        )
    token = field(form, "token")
    found = tokens.verify(token) if token else None
    if found is None:
        return pages.render(
            request,
            "login.html",
            ANONYMOUS,
            status=401,
            nav="login",
            next=nxt,
            error="Unknown or revoked token. Paste a token made by "
            "`redrive token create` (it starts with rdv_).",
        )
    response = session.redirect(request, nxt, "ok", f"Signed in as {found.name} ({found.role}).")
    session.sign_in(request, response, token)
    return response


@router.post("/login", response_class=HTMLResponse)
async def login_form(request: Request, pages: PagesDep, tokens: TokenBook) -> Response:
    form = await request.form()
    return await run_in_threadpool(_login, request, form, pages, tokens)


@router.api_route("/logout", methods=["GET", "POST"], response_class=HTMLResponse)
def logout(request: Request) -> Response:
    response = session.redirect(request, "/login", "ok", "Signed out.")
    session.sign_out(response)
    return response
