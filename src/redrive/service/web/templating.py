"""The web UI's pages as HTML: the Jinja templates (autoescaped), the security
headers, the session's CSRF token and one-time message, the no-script confirmation
page, and the search suggestions (from counts cached for a few seconds)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse
from starlette.datastructures import FormData

from redrive.service.auth import ANONYMOUS, Principal
from redrive.service.config import ServiceSettings
from redrive.service.web import session
from redrive.service.web.formatting import number, visible, when
from redrive.service.web.params import here

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
STATS_TTL_S = 5.0

Stats = dict[str, Any]


class StatsCache:
    """The operator statistics for a few seconds: the lists use them for suggestions."""

    def __init__(self, fetch: Callable[[], Stats]) -> None:
        self._fetch = fetch
        self._lock = threading.Lock()
        self._value: Stats | None = None
        self._at = 0.0

    def get(self, fresh: bool = False) -> Stats:
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


class Pages:
    """Renders the templates with what every page shows (who is signed in, the CSRF
    token, the one-time message) and the page's own context."""

    def __init__(self, stats: Callable[[], Stats], settings: ServiceSettings, version: str) -> None:
        self.stats = StatsCache(stats)
        # Read on each page, not copied: require_token_for_reads and the allowlist
        # are the settings' current values.
        self._settings = settings
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
        self.env.globals["version"] = version
        # A replay form's rate, when left empty (the placeholder says what it will be).
        self.env.globals["replay_rate"] = f"{settings.replay_rate_per_second:g}"

    def render(
        self,
        request: Request,
        template: str,
        who: Principal,
        status: int = 200,
        **context: Any,
    ) -> HTMLResponse:
        csrf, new_csrf = session.csrf_token(request)
        flash = session.read_flash(request)
        context.setdefault("nav", None)
        stale = session.stale_session(request, who)
        html = self.env.get_template(template).render(
            who=who,
            signed_in=who is not ANONYMOUS,
            operator=who.may("operator"),
            csrf=csrf,
            flash=flash,
            stale_session=stale,
            here=here(request),
            read_only_api=self._settings.require_token_for_reads,
            **context,
        )
        response = HTMLResponse(html, status_code=status, headers=session.SECURITY_HEADERS)
        if new_csrf:
            session.set_cookie(request, response, session.CSRF_COOKIE, csrf)
        if flash is not None or request.cookies.get(session.FLASH_COOKIE):
            response.delete_cookie(session.FLASH_COOKIE, path="/")
        if stale:
            session.sign_out(response)
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
            "replay_targets": [t for t in topics if self._settings.destination_allowed(t)],
        }
