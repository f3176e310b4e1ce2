"""The web UI: server-rendered pages for operators, on the same server as the API.

Pages: the overview (counts and the last hour's rates), pending retries, dead letters
(search, select, bulk replay or delete) and one dead letter (payload, headers, trace,
replay, edit and replay, delete), plus sign-in with an API token.

How it stays safe and consistent with the REST API:

- Every action calls the REST API's own endpoint function in-process (`_Api`), so the
  UI replays, deletes and writes the audit log exactly as the API does, and shows
  the API's refusal (destination not allowed, not found...) as its message.
- The token sits in an HttpOnly, SameSite=Strict cookie. Reads are open unless
  `require_token_for_reads`; actions need an operator token.
- Forms are protected against cross-site requests by a random token kept in a cookie
  and repeated in a hidden field (compared in constant time), on top of SameSite.
- Templates autoescape everything; payloads are always shown as text. Pages carry a
  Content-Security-Policy that allows no inline script either.
- Confirmation: the small script asks in a <dialog>; without script the server asks
  on a confirmation page instead, so every form works either way.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import jinja2
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData

from redrive.headers import is_redrive_header
from redrive.service.actions import (
    ActionRefused,
    OperatorActions,
    Payload,
    ReplayMany,
    ReplayOne,
    Selection,
)
from redrive.service.api import dead_letter_detail, dead_letter_summary, pending_view
from redrive.service.auth import ANONYMOUS, Principal
from redrive.service.filters import DeadLetterFilter, FilterError, PendingFilter

if TYPE_CHECKING:
    from redrive.service.service import RetryService

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"

SESSION_COOKIE = "redrive_session"
CSRF_COOKIE = "redrive_csrf"
FLASH_COOKIE = "redrive_flash"
SESSION_MAX_AGE_S = 12 * 3600
PAGE_SIZE = 50
STATS_TTL_S = 5.0
_CSRF_SHAPE = re.compile(r"^[A-Za-z0-9_-]{32,128}$")

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

FILTER_FIELDS = ("topic", "group", "error_type", "text", "reason", "since", "until")
FILTER_LABELS = {
    "topic": "topic",
    "group": "group",
    "error_type": "error type",
    "text": "error text",
    "reason": "reason",
    "since": "since",
    "until": "until",
}

NEEDS_OPERATOR = "This action needs an operator token: sign in with an operator token."


# ------------------------------------------------------------------ the API, in-process


# The REST API endpoints the UI acts through, and the parameters it passes them.
class _Api:
    """The operator actions (actions.py), called after the UI has checked the caller
    (role and CSRF): the same replay, delete and audit code as the REST API."""

    def __init__(self, service: RetryService) -> None:
        self._actions = OperatorActions(service)

    def call(self, name: str, **kwargs: Any) -> tuple[bool, Any]:
        """(True, result) or (False, the refusal as a sentence)."""
        try:
            return True, getattr(self._actions, name)(**kwargs)
        except ActionRefused as exc:
            return False, exc.detail
        except (ValidationError, FilterError, ValueError) as exc:
            return False, _explain(exc)


def _explain(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        parts = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error.get("loc", ()))
            msg = str(error.get("msg", "invalid")).removeprefix("Value error, ")
            parts.append(f"{FILTER_LABELS.get(where, where)}: {msg}" if where else msg)
        return "; ".join(parts)
    return str(exc)


# ------------------------------------------------------------------ formatting


def _span(seconds: float) -> str:
    s = int(abs(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 10:
        return f"{m}m {s}s" if s else f"{m}m"
    if m < 60:
        return f"{m}m"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h {m}m" if m else f"{h}h"
    d, h = divmod(h, 24)
    return f"{d}d {h}h" if h else f"{d}d"


def relative(when: datetime, now: datetime) -> str:
    """'in 12s', '3m 5s ago', 'now'."""
    delta = (when - now).total_seconds()
    if abs(delta) < 1:
        return "now"
    return f"in {_span(delta)}" if delta > 0 else f"{_span(delta)} ago"


@dataclass(frozen=True, slots=True)
class When:
    iso: str | None  # None: beyond the calendar (no <time> element)
    absolute: str
    rel: str


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _beyond_calendar(ms: int) -> When:
    """A time in epoch ms that datetime cannot hold (a producer may set any int64)."""
    side = "after the year 9999" if ms > 0 else "before the year 1"
    return When(iso=None, absolute=f"{ms:,} ms since 1970 ({side})", rel=side)


def when(value: datetime | str | int | None) -> When | None:
    """A time for display: datetime, ISO text or epoch milliseconds (any int64)."""
    if value is None or value == "":
        return None
    if isinstance(value, int):
        try:
            # Integer arithmetic: exact, and OverflowError (not a wrong date) outside
            # the years 1 to 9999.
            at = EPOCH + timedelta(milliseconds=value)
        except OverflowError:
            return _beyond_calendar(value)
    elif isinstance(value, str):
        at = datetime.fromisoformat(value)
    else:
        at = value
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    # An offset that would move it past the year 1 or 9999: shown in its own offset.
    with contextlib.suppress(OverflowError):
        at = at.astimezone(UTC)
    return When(
        iso=at.isoformat(timespec="milliseconds"),
        # %Y does not pad years before 1000 on every platform.
        absolute=f"{at.year:04d}" + at.strftime("-%m-%d %H:%M:%S %Z"),
        rel=relative(at, datetime.now(UTC)),
    )


def number(value: int | float) -> str:
    return f"{value:,}"


def hexdump(raw: bytes) -> str:
    lines = []
    for offset in range(0, len(raw), 16):
        chunk = raw[offset : offset + 16]
        hexes = (
            " ".join(f"{b:02x}" for b in chunk[:8]) + "  " + " ".join(f"{b:02x}" for b in chunk[8:])
        )
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:08x}  {hexes:<49} {text}")
    return "\n".join(lines)


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def visible(text: str | None) -> str:
    """Text with its control characters written as escapes (\\x00), for table cells."""
    if text is None:
        return ""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def payload_view(rendered: dict[str, Any] | None) -> dict[str, Any]:
    """How to show a key or value rendered by the API's render_bytes."""
    if rendered is None:
        return {"kind": "null", "size": 0, "body": "", "text": None, "raw": None}
    text = rendered["text"]
    parsed = rendered["json"]
    view: dict[str, Any] = {"size": rendered["size"], "text": text, "raw": text}
    if isinstance(parsed, dict | list):
        view |= {"kind": "json", "body": json.dumps(parsed, indent=2, ensure_ascii=False)}
    elif text is not None and not _CONTROL.search(text):
        view |= {"kind": "text", "body": text}
    else:
        view |= {"kind": "binary", "body": hexdump(bytes.fromhex(rendered["hex"]))}
    view["truncated"] = view["kind"] == "binary" and rendered["hex_truncated"]
    return view


# ------------------------------------------------------------------ charts


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50... at or above `value`."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= value:
                return step * factor
        step *= 10


def chart(
    series: dict[str, list[dict[str, Any]]],
    bars: str,
    line: str | None = None,
    width: int = 720,
    height: int = 170,
) -> dict[str, Any]:
    """Geometry of an SVG chart of per-minute counts: bars, an optional line."""
    left, right, top, bottom = 44, 8, 10, 24
    points = series[bars]
    n = max(len(points), 1)
    values = [p["count"] for p in points]
    others = [p["count"] for p in series[line]] if line else [0] * len(points)
    peak = _nice_ceiling(max([*values, *others, 1]))
    inner_w, inner_h = width - left - right, height - top - bottom
    slot = inner_w / n
    bar_w = max(slot * 0.72, 1.0)

    def y_of(v: int) -> float:
        return top + inner_h - v / peak * inner_h

    slots = []
    for i, point in enumerate(points):
        minute = datetime.fromisoformat(point["minute"]).astimezone(UTC)
        x = left + i * slot
        label = f"{minute:%H:%M} UTC: {point['count']:,} {bars.replace('_', ' ')}"
        if line:
            label += f", {others[i]:,} {line.replace('_', ' ')}"
        slots.append(
            {
                "x": round(x, 2),
                "w": round(slot, 2),
                "bar_x": round(x + (slot - bar_w) / 2, 2),
                "bar_w": round(bar_w, 2),
                "bar_y": round(y_of(point["count"]), 2),
                "bar_h": round(inner_h - (y_of(point["count"]) - top), 2),
                "label": label,
            }
        )
    polyline = ""
    if line:
        polyline = " ".join(
            f"{left + (i + 0.5) * slot:.2f},{y_of(v):.2f}" for i, v in enumerate(others)
        )
    marks = (0, peak // 2, peak) if peak % 2 == 0 else (0, peak)
    ticks = [{"y": round(y_of(v), 2), "label": f"{v:,}"} for v in marks]
    xlabels = []
    for i in (0, len(points) // 2, len(points) - 1) if points else ():
        minute = datetime.fromisoformat(points[i]["minute"]).astimezone(UTC)
        xlabels.append({"x": round(left + (i + 0.5) * slot, 2), "label": f"{minute:%H:%M}"})
    return {
        "width": width,
        "height": height,
        "left": left,
        "right": width - right,
        "base": top + inner_h,
        "slots": slots,
        "polyline": polyline,
        "ticks": ticks,
        "xlabels": xlabels,
        "total": sum(values),
        "line_total": sum(others),
        "bars": bars,
        "line": line,
    }


def breakdown(rows: list[dict[str, Any]], link: str | None) -> list[dict[str, Any]]:
    """Rows of a by-key count table with each row's share and its filtered-list link."""
    peak = max((r["count"] for r in rows), default=0) or 1
    return [
        {
            "key": r["key"],
            "count": r["count"],
            "share": round(r["count"] / peak * 100, 1),
            "href": f"{link}{quote(str(r['key']), safe='')}" if link and r["key"] else None,
        }
        for r in rows
    ]


# ------------------------------------------------------------------ small helpers


def _field(form: Mapping[str, Any], name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


def local_url(url: str | None, default: str, prefix: str = "/") -> str:
    """`url` if it is a path on this server starting with `prefix`, else `default`
    (no open redirects, no header injection)."""
    if (
        not url
        or not url.startswith(prefix)
        or url.startswith("//")
        or "\\" in url
        or not url.isascii()
        or not url.isprintable()
    ):
        return default
    return url


def _query(**params: str | None) -> str:
    kept = {k: v for k, v in params.items() if v}
    return "?" + urlencode(kept) if kept else ""


def _here(request: Request) -> str:
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


def _parse_time(name: str, text: str) -> datetime:
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{name}: {text!r} is not a date and time (YYYY-MM-DDTHH:MM)") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def dead_letter_filter(values: Mapping[str, Any]) -> tuple[DeadLetterFilter, dict[str, str]]:
    """The dead-letter filter of a query string or form, and its raw field values;
    raises ValueError with a readable message."""
    raw = {name: _field(values, name) for name in FILTER_FIELDS}
    args: dict[str, Any] = {k: v for k, v in raw.items() if v}
    for name in ("since", "until"):
        if name in args:
            args[name] = _parse_time(name, args[name])
    try:
        return DeadLetterFilter(**args), raw
    except ValidationError as exc:
        raise ValueError(_explain(exc)) from None


def describe_filter(raw: Mapping[str, str]) -> str:
    parts = [f"{FILTER_LABELS[k]} {raw[k]!r}" for k in FILTER_FIELDS if raw.get(k)]
    return ", ".join(parts)


class _StatsCache:
    """ops.stats() for a few seconds: the lists use it for search suggestions."""

    def __init__(self, fetch: Callable[[], dict[str, Any]]) -> None:
        self._fetch = fetch
        self._lock = threading.Lock()
        self._value: dict[str, Any] | None = None
        self._at = 0.0

    def get(self, fresh: bool = False) -> dict[str, Any]:
        with self._lock:
            if fresh or self._value is None or time.monotonic() - self._at > STATS_TTL_S:
                self._value = self._fetch()
                self._at = time.monotonic()
            return self._value

    def clear(self) -> None:
        with self._lock:
            self._value = None


def _keys(rows: list[dict[str, Any]]) -> list[str]:
    return [str(r["key"]) for r in rows if r["key"]]


# ------------------------------------------------------------------ the UI


class WebUI:
    def __init__(self, service: RetryService) -> None:
        self.service = service
        self.ops = service.operations
        self.settings = service.settings
        self.api = _Api(service)
        self.stats = _StatsCache(self.ops.stats)
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(TEMPLATES),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters["number"] = number
        self.env.filters["visible"] = visible
        self.env.globals["when"] = when
        self.env.globals["version"] = service.version

    # -------------------------------------------------------------- who, csrf, flash

    def principal(self, request: Request) -> Principal:
        token = request.cookies.get(SESSION_COOKIE)
        if not token:
            return ANONYMOUS
        return self.service.tokens.verify(token) or ANONYMOUS

    def may_read(self, who: Principal) -> bool:
        return who.may("viewer") or not self.settings.require_token_for_reads

    @staticmethod
    def csrf_ok(request: Request, form: Mapping[str, Any]) -> bool:
        cookie = request.cookies.get(CSRF_COOKIE, "")
        field = _field(form, "csrf")
        if not _CSRF_SHAPE.match(cookie) or not _CSRF_SHAPE.match(field):
            return False
        if request.headers.get("sec-fetch-site") == "cross-site":
            return False
        return hmac.compare_digest(cookie.encode(), field.encode())

    @staticmethod
    def _secure(request: Request) -> bool:
        return request.url.scheme == "https"

    def set_cookie(
        self, request: Request, response: Response, name: str, value: str, **kw: Any
    ) -> None:
        response.set_cookie(
            name,
            value,
            path="/",
            httponly=True,
            samesite="strict",
            secure=self._secure(request),
            **kw,
        )

    @staticmethod
    def _flash(request: Request) -> dict[str, str] | None:
        raw = request.cookies.get(FLASH_COOKIE)
        if not raw:
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(raw.encode()))
        except (ValueError, binascii.Error):
            return None
        if not isinstance(data, dict) or data.get("kind") not in ("ok", "error"):
            return None
        return {"kind": str(data["kind"]), "text": str(data.get("text", ""))[:1000]}

    def redirect(self, request: Request, url: str, kind: str, text: str) -> Response:
        """POST-redirect-GET, with the outcome shown once on the next page."""
        response = RedirectResponse(url, status_code=303, headers=SECURITY_HEADERS)
        payload = json.dumps({"kind": kind, "text": text[:1000]}).encode()
        self.set_cookie(
            request, response, FLASH_COOKIE, base64.urlsafe_b64encode(payload).decode(), max_age=60
        )
        return response

    # -------------------------------------------------------------- rendering

    def render(
        self,
        request: Request,
        template: str,
        who: Principal,
        status: int = 200,
        **context: Any,
    ) -> HTMLResponse:
        csrf = request.cookies.get(CSRF_COOKIE, "")
        new_csrf = not _CSRF_SHAPE.match(csrf)
        if new_csrf:
            csrf = secrets.token_urlsafe(32)
        flash = self._flash(request)
        context.setdefault("nav", None)
        stale = bool(request.cookies.get(SESSION_COOKIE)) and who is ANONYMOUS
        html = self.env.get_template(template).render(
            who=who,
            signed_in=who is not ANONYMOUS,
            operator=who.may("operator"),
            csrf=csrf,
            flash=flash,
            stale_session=stale,
            here=_here(request),
            read_only_api=self.settings.require_token_for_reads,
            **context,
        )
        response = HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
        if new_csrf:
            self.set_cookie(request, response, CSRF_COOKIE, csrf)
        if flash is not None or request.cookies.get(FLASH_COOKIE):
            response.delete_cookie(FLASH_COOKIE, path="/")
        if stale:
            response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    def error(
        self, request: Request, who: Principal, status: int, title: str, text: str, **more: Any
    ) -> HTMLResponse:
        return self.render(
            request, "error.html", who, status=status, title=title, text=text, **more
        )

    def confirm(
        self,
        request: Request,
        who: Principal,
        form: FormData,
        question: str,
        button: str,
        back: str,
        danger: bool = False,
    ) -> HTMLResponse:
        """The no-script confirmation: the same form again, confirmed."""
        fields = [
            (k, v)
            for k, v in form.multi_items()
            if isinstance(v, str) and k not in ("csrf", "confirmed")
        ]
        return self.render(
            request,
            "confirm.html",
            who,
            question=question,
            button=button,
            danger=danger,
            action=request.url.path,
            fields=fields,
            back=back,
        )

    def suggestions(self) -> dict[str, list[str]]:
        stats = self.stats.get()
        dead, pending = stats["dead_letters"], stats["pending"]
        topics = sorted(set(_keys(dead["by_topic"])) | set(_keys(pending["by_destination"])))
        return {
            "topics": topics,
            "destinations": _keys(pending["by_destination"]),
            "groups": _keys(dead["by_group"]),
            "error_types": _keys(dead["by_error_type"]),
            "reasons": _keys(dead["by_reason"]),
            "replay_targets": [t for t in topics if self.settings.destination_allowed(t)],
        }


def _confirmed(form: Mapping[str, Any]) -> bool:
    return _field(form, "confirmed") == "1"


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}" + ("" if count == 1 else "s")


# ------------------------------------------------------------------ the router

Action = Callable[[Request, FormData, Principal], Response]


def create_ui_router(service: RetryService) -> APIRouter:
    """The web UI's pages and form actions, to be included at the root of the app."""
    ui = WebUI(service)
    ops = ui.ops
    router = APIRouter(include_in_schema=False)

    def reader(request: Request) -> tuple[Principal, Response | None]:
        """The caller, and a response instead of the page when they may not read."""
        who = ui.principal(request)
        if ui.may_read(who):
            return who, None
        if (
            not request.cookies.get(SESSION_COOKIE)
            and request.headers.get("sec-fetch-site") == "cross-site"
        ):
            # A link from another site: SameSite=Strict withheld the cookie; reload
            # same-site so that it is sent.
            return who, ui.render(request, "reload.html", who)
        login = "/login" + _query(next=_here(request))
        return who, RedirectResponse(login, status_code=303, headers=SECURITY_HEADERS)

    def action(path: str) -> Callable[[Action], Action]:
        """Register a form action: CSRF check, operator check, then `fn` in a thread."""

        def register(fn: Action) -> Action:
            def checked(request: Request, form: FormData) -> Response:
                who = ui.principal(request)
                if not ui.csrf_ok(request, form):
                    return ui.error(
                        request,
                        who,
                        403,
                        "Form expired",
                        "This form was refused: its CSRF token is missing or does not match "
                        "(an old page, or a request from another site). Go back, reload the "
                        "page and try again.",
                    )
                if not who.may("operator"):
                    back = local_url(_field(form, "back"), "/")
                    return ui.error(
                        request,
                        who,
                        403,
                        "Operator token needed",
                        NEEDS_OPERATOR,
                        login_next=back,
                    )
                response = fn(request, form, who)
                ui.stats.clear()
                return response

            async def endpoint(request: Request) -> Response:
                form = await request.form()
                return await run_in_threadpool(checked, request, form)

            endpoint.__name__ = f"ui_{fn.__name__}"
            router.add_api_route(path, endpoint, methods=["POST"], response_class=HTMLResponse)
            return fn

        return register

    # -------------------------------------------------------------- overview

    @router.get("/", response_class=HTMLResponse)
    def overview(request: Request) -> Response:
        who, refused = reader(request)
        if refused:
            return refused
        stats = ui.stats.get(fresh=True)
        series = ops.rates(60)
        dead, pending = stats["dead_letters"], stats["pending"]
        return ui.render(
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
        )

    # -------------------------------------------------------------- pending retries

    @router.get("/pending", response_class=HTMLResponse)
    def pending(request: Request) -> Response:
        who, refused = reader(request)
        if refused:
            return refused
        q = request.query_params
        destination, group, cursor = (_field(q, n) for n in ("destination", "group", "cursor"))
        error, rows, next_cursor = None, [], None
        try:
            flt = PendingFilter(destination=destination or None, group=group or None)
            found, next_cursor = ops.pending(flt, limit=PAGE_SIZE, cursor=cursor or None)
            rows = [pending_view(r, full=False) for r in found]
        except (ValidationError, FilterError) as exc:
            error = _explain(exc)
        return ui.render(
            request,
            "pending.html",
            who,
            nav="pending",
            rows=rows,
            error=error,
            destination=destination,
            group=group,
            filtered=bool(destination or group),
            total=ui.stats.get()["pending"]["total"],
            first_page=bool(cursor),
            next_url="/pending" + _query(destination=destination, group=group, cursor=next_cursor)
            if next_cursor
            else None,
            first_url="/pending" + _query(destination=destination, group=group),
            suggest=ui.suggestions(),
        )

    @action("/pending/{pending_id:int}/retry-now")
    def retry_now(request: Request, form: FormData, who: Principal) -> Response:
        pending_id = int(request.path_params["pending_id"])
        back = local_url(_field(form, "back"), "/pending", "/pending")
        ok, result = ui.api.call("retry_now", who=who, pending_id=pending_id)
        if not ok:
            return ui.redirect(request, back, "error", f"Retry now refused: {result}")
        return ui.redirect(request, back, "ok", f"Pending retry {pending_id} is due now.")

    @action("/pending/{pending_id:int}/cancel")
    def cancel(request: Request, form: FormData, who: Principal) -> Response:
        pending_id = int(request.path_params["pending_id"])
        back = local_url(_field(form, "back"), "/pending", "/pending")
        if not _confirmed(form):
            question = (
                f"Cancel pending retry {pending_id}? It moves to the dead letters "
                "(reason: cancelled) instead of being delivered."
            )
            return ui.confirm(request, who, form, question, "Cancel retry", back, danger=True)
        ok, result = ui.api.call("cancel", who=who, pending_id=pending_id)
        if not ok:
            return ui.redirect(request, back, "error", f"Cancel refused: {result}")
        return ui.redirect(
            request, back, "ok", f"Pending retry {pending_id} cancelled: it is now a dead letter."
        )

    # -------------------------------------------------------------- dead letters

    @router.get("/dead-letters", response_class=HTMLResponse)
    def dead_letters(request: Request) -> Response:
        who, refused = reader(request)
        if refused:
            return refused
        q = request.query_params
        cursor = _field(q, "cursor")
        raw = {name: _field(q, name) for name in FILTER_FIELDS}
        error, rows, next_cursor, matching = None, [], None, 0
        try:
            flt, raw = dead_letter_filter(q)
            found, next_cursor = ops.dead_letters(flt, limit=PAGE_SIZE, cursor=cursor or None)
            rows = [dead_letter_summary(r) for r in found]
            matching = ops.count_dead_letters(flt)
        except (ValueError, FilterError) as exc:
            error = str(exc)
        filter_query = {k: v for k, v in raw.items() if v}
        here = _here(request)
        return ui.render(
            request,
            "dead_letters.html",
            who,
            nav="dead-letters",
            rows=rows,
            raw=raw,
            error=error,
            matching=matching,
            filtered=bool(filter_query),
            described=describe_filter(raw),
            back=here,
            back_q=quote(here, safe=""),
            first_page=bool(cursor),
            next_url="/dead-letters" + _query(**filter_query, cursor=next_cursor)
            if next_cursor
            else None,
            first_url="/dead-letters" + _query(**filter_query),
            export_url="/api/v1/dead-letters/export" + _query(**filter_query),
            suggest=ui.suggestions(),
        )

    @action("/dead-letters/bulk")
    def bulk(request: Request, form: FormData, who: Principal) -> Response:
        back = local_url(_field(form, "back"), "/dead-letters", "/dead-letters")
        op = _field(form, "op")
        if op not in ("replay:selected", "delete:selected", "replay:matching", "delete:matching"):
            return ui.redirect(request, back, "error", f"Unknown bulk action {op!r}.")
        verb, scope = op.split(":")
        body: dict[str, Any]
        if scope == "selected":
            try:
                ids = sorted({int(str(v)) for v in form.getlist("ids")})
            except ValueError:
                return ui.redirect(request, back, "error", "The selection is not a list of ids.")
            if not ids:
                return ui.redirect(
                    request, back, "error", "Select dead letters first (x toggles a row)."
                )
            body = {"ids": ids}
            what = f"the {_plural(len(ids), 'selected dead letter')}"
        else:
            try:
                flt, raw = dead_letter_filter(form)
            except ValueError as exc:
                return ui.redirect(request, back, "error", f"Bad filter: {exc}")
            body = {"filter": flt, "all": _field(form, "all") == "1"}
            count = ops.count_dead_letters(flt)
            described = describe_filter(raw)
            what = (
                f"all {_plural(count, 'dead letter')} matching {described}"
                if described
                else f"every dead letter ({count:,})"
            )
        if not _confirmed(form):
            if verb == "replay":
                question = f"Replay {what} to their topics? Each is deleted once the broker has it."
            else:
                question = f"Delete {what}? This cannot be undone."
            button = "Replay" if verb == "replay" else "Delete"
            return ui.confirm(request, who, form, question, button, back, danger=verb == "delete")
        if verb == "replay":
            try:
                replay = ReplayMany(**body)
            except ValidationError as exc:
                return ui.redirect(request, back, "error", _explain(exc))
            ok, result = ui.api.call("replay_many", who=who, body=replay)
            if not ok:
                return ui.redirect(request, back, "error", f"Replay refused: {result}")
            text = f"Replayed {_plural(result['replayed'], 'dead letter')}."
            if result["failed"]:
                text += f" {len(result['failed']):,} not acknowledged by the broker (kept)."
            if result.get("remaining"):
                text += f" {result['remaining']:,} more match: replay again for the rest."
            return ui.redirect(request, back, "error" if result["failed"] else "ok", text)
        try:
            selection = Selection(**body)
        except ValidationError as exc:
            return ui.redirect(request, back, "error", _explain(exc))
        ok, result = ui.api.call("delete_many", who=who, body=selection)
        if not ok:
            return ui.redirect(request, back, "error", f"Delete refused: {result}")
        return ui.redirect(
            request, back, "ok", f"Deleted {_plural(result['deleted'], 'dead letter')}."
        )

    @router.get("/dead-letters/{letter_id:int}", response_class=HTMLResponse)
    def dead_letter(request: Request, letter_id: int) -> Response:
        who, refused = reader(request)
        if refused:
            return refused
        back = local_url(request.query_params.get("back"), "/dead-letters", "/dead-letters")
        row = ops.dead_letter(letter_id)
        if row is None:
            return ui.error(
                request,
                who,
                404,
                "Not found",
                f"Dead letter {letter_id} does not exist: it was replayed or deleted.",
                back=back,
            )
        detail = dead_letter_detail(row)
        headers = [{**h, "redrive": is_redrive_header(h["name"])} for h in detail["headers"]]
        return ui.render(
            request,
            "dead_letter.html",
            who,
            nav="dead-letters",
            d=detail,
            key=payload_view(detail["key"]),
            value=payload_view(detail["value"]),
            headers=headers,
            user_headers=sum(1 for h in headers if not h["redrive"]),
            back=back,
            suggest=ui.suggestions(),
        )

    @action("/dead-letters/{letter_id:int}/replay")
    def replay(request: Request, form: FormData, who: Principal) -> Response:
        letter_id = int(request.path_params["letter_id"])
        back = local_url(_field(form, "back"), "/dead-letters", "/dead-letters")
        here = f"/dead-letters/{letter_id}" + _query(back=back)
        destination = _field(form, "destination") or None
        keep = _field(form, "keep") == "1"
        edited = "value" in form
        value = None
        if edited:
            raw_value = form.get("value")
            value = raw_value if isinstance(raw_value, str) else ""
            row = ops.dead_letter(letter_id)
            original = row["msg_value"] if row else None
            # Browsers send a textarea's line breaks as CRLF: keep the original's style.
            if original is None or b"\r\n" not in original:
                value = value.replace("\r\n", "\n")
        if not _confirmed(form):
            target = destination or "its topic"
            verb = "Replay the edited value of" if edited else "Replay"
            question = f"{verb} dead letter {letter_id} to {target}?"
            if not keep:
                question += " It is deleted once the broker has it."
            return ui.confirm(request, who, form, question, "Replay", here)
        try:
            body = ReplayOne(
                destination=destination,
                keep=keep,
                value=Payload(text=value) if value is not None else None,
            )
        except ValidationError as exc:
            return ui.redirect(request, here, "error", _explain(exc))
        ok, result = ui.api.call("replay_one", who=who, letter_id=letter_id, body=body)
        if not ok:
            return ui.redirect(request, here, "error", f"Replay refused: {result}")
        to = destination or "its topic"
        if keep:
            return ui.redirect(
                request, here, "ok", f"Replayed dead letter {letter_id} to {to} (kept)."
            )
        return ui.redirect(request, back, "ok", f"Replayed dead letter {letter_id} to {to}.")

    @action("/dead-letters/{letter_id:int}/delete")
    def delete(request: Request, form: FormData, who: Principal) -> Response:
        letter_id = int(request.path_params["letter_id"])
        back = local_url(_field(form, "back"), "/dead-letters", "/dead-letters")
        if not _confirmed(form):
            question = f"Delete dead letter {letter_id}? This cannot be undone."
            here = f"/dead-letters/{letter_id}" + _query(back=back)
            return ui.confirm(request, who, form, question, "Delete", here, danger=True)
        ok, result = ui.api.call("delete_one", who=who, letter_id=letter_id)
        if not ok:
            return ui.redirect(request, back, "error", f"Delete refused: {result}")
        return ui.redirect(request, back, "ok", f"Deleted dead letter {letter_id}.")

    # -------------------------------------------------------------- sign in and out

    @router.get("/login", response_class=HTMLResponse)
    def login_page(request: Request) -> Response:
        who = ui.principal(request)
        nxt = local_url(request.query_params.get("next"), "/")
        return ui.render(request, "login.html", who, nav="login", next=nxt, error=None)

    async def login_form(request: Request) -> Response:
        form = await request.form()
        return await run_in_threadpool(login, request, form)

    def login(request: Request, form: FormData) -> Response:
        nxt = local_url(_field(form, "next"), "/")
        if not ui.csrf_ok(request, form):
            return ui.render(
                request,
                "login.html",
                ANONYMOUS,
                status=403,
                nav="login",
                next=nxt,
                error="The sign-in form expired (CSRF check failed). Please try again.",
            )
        token = _field(form, "token")
        found = ui.service.tokens.verify(token) if token else None
        if found is None:
            return ui.render(
                request,
                "login.html",
                ANONYMOUS,
                status=401,
                nav="login",
                next=nxt,
                error="Unknown or revoked token. Paste a token made by "
                "`redrive token create` (it starts with rdv_).",
            )
        response = ui.redirect(request, nxt, "ok", f"Signed in as {found.name} ({found.role}).")
        ui.set_cookie(request, response, SESSION_COOKIE, token, max_age=SESSION_MAX_AGE_S)
        # A fresh CSRF token for the new session.
        ui.set_cookie(request, response, CSRF_COOKIE, secrets.token_urlsafe(32))
        return response

    router.add_api_route("/login", login_form, methods=["POST"], response_class=HTMLResponse)

    @router.api_route("/logout", methods=["GET", "POST"], response_class=HTMLResponse)
    def logout(request: Request) -> Response:
        response = ui.redirect(request, "/login", "ok", "Signed out.")
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    return router


def mount_ui(app: FastAPI, service: RetryService) -> None:
    """Add the web UI to the service's app: its pages at / and its assets at /static.
    Calling it again on the same app does nothing."""
    if getattr(app.state, "redrive_ui", False):
        return
    app.include_router(create_ui_router(service))
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.state.redrive_ui = True


__all__ = ["WebUI", "create_ui_router", "mount_ui"]
