"""The web UI's session: who is signed in, the CSRF guard, and one-time messages.

- The API token sits in an HttpOnly, SameSite=Strict cookie (`redrive_session`),
  checked on every request like a bearer token.
- Forms are protected against cross-site requests by a random token kept in a cookie
  and repeated in a hidden field (compared in constant time), on top of SameSite; a
  request the browser marks as cross-site is refused outright.
- The outcome of a form (POST-redirect-GET) is shown once on the next page, through a
  short-lived cookie.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import re
import secrets
from collections.abc import Mapping
from typing import Any

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from redrive.service.auth import ANONYMOUS, Principal, Tokens
from redrive.service.web.params import field

SESSION_COOKIE = "redrive_session"
CSRF_COOKIE = "redrive_csrf"
FLASH_COOKIE = "redrive_flash"
SESSION_MAX_AGE_S = 12 * 3600
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


def signed_in(request: Request, tokens: Tokens) -> Principal:
    """The principal of the session cookie's token; ANONYMOUS without a valid one."""
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        return ANONYMOUS
    return tokens.verify(token) or ANONYMOUS


def stale_session(request: Request, who: Principal) -> bool:
    """A session cookie whose token is no longer valid (revoked, or unknown)."""
    return bool(request.cookies.get(SESSION_COOKIE)) and who is ANONYMOUS


def csrf_ok(request: Request, form: Mapping[str, Any]) -> bool:
    cookie = request.cookies.get(CSRF_COOKIE, "")
    given = field(form, "csrf")
    if not _CSRF_SHAPE.match(cookie) or not _CSRF_SHAPE.match(given):
        return False
    if request.headers.get("sec-fetch-site") == "cross-site":
        return False
    return hmac.compare_digest(cookie.encode(), given.encode())


def csrf_token(request: Request) -> tuple[str, bool]:
    """The CSRF token for the page's forms, and whether it is new (to be set)."""
    csrf = request.cookies.get(CSRF_COOKIE, "")
    if _CSRF_SHAPE.match(csrf):
        return csrf, False
    return new_csrf_token(), True


def new_csrf_token() -> str:
    return secrets.token_urlsafe(32)


def set_cookie(request: Request, response: Response, name: str, value: str, **kw: Any) -> None:
    response.set_cookie(
        name,
        value,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        **kw,
    )


def sign_in(request: Request, response: Response, token: str) -> None:
    set_cookie(request, response, SESSION_COOKIE, token, max_age=SESSION_MAX_AGE_S)
    # A fresh CSRF token for the new session.
    set_cookie(request, response, CSRF_COOKIE, new_csrf_token())


def sign_out(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/")


def read_flash(request: Request) -> dict[str, str] | None:
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


def redirect(request: Request, url: str, kind: str, text: str) -> Response:
    """POST-redirect-GET, with the outcome shown once on the next page."""
    response = RedirectResponse(url, status_code=303, headers=SECURITY_HEADERS)
    payload = json.dumps({"kind": kind, "text": text[:1000]}).encode()
    set_cookie(
        request, response, FLASH_COOKIE, base64.urlsafe_b64encode(payload).decode(), max_age=60
    )
    return response
