"""The service's HTTP server: the REST API, the web UI, /metrics, /healthz, /readyz.

/healthz answers whenever the process serves HTTP (liveness). /readyz answers 200
only when the store is reachable and every role is healthy, 503 otherwise, with a
body saying which part is not ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from redrive.service.api import ErrorBody, create_router
from redrive.service.ui import mount_ui

if TYPE_CHECKING:
    from redrive.service.service import RetryService


def _explain(errors: list[Any]) -> str:
    """Pydantic's errors as one readable line: `where: what` for each."""
    parts = []
    for error in errors:
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "request"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(parts)


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(app: FastAPI, scope: Scope, named: str = "") -> list[str]:
    """Every method some route serves at this request's path, with those `named` by
    the refusal. Starlette's own `Allow` names only the first route matching the
    path, while e.g. GET and DELETE /api/v1/dead-letters/{id} are two routes. A mount
    (/static) answers any method itself: its refusal names what it serves."""
    methods = {m.strip().upper() for m in named.split(",") if m.strip()}
    routes = [route for route in app.router.routes if not isinstance(route, Mount)]
    for method in _METHODS:
        probe = {**scope, "method": method}
        if any(route.matches(probe)[0] == Match.FULL for route in routes):
            methods.add(method)
    return sorted(methods)


def method_not_allowed(app: FastAPI, request: Request, exc: StarletteHTTPException) -> JSONResponse:
    named = (exc.headers or {}).get("Allow", "")
    allow = ", ".join(allowed_methods(app, request.scope, named))
    return JSONResponse(
        {"detail": f"method {request.method} is not allowed here; allowed: {allow}"},
        status_code=405,
        headers={"Allow": allow},
    )


_VALIDATION_REFS = ("#/components/schemas/HTTPValidationError",)


def _error_refs(node: Any) -> Any:
    """The document with FastAPI's list-of-errors 422 replaced by ErrorBody: the
    handler below answers `{"detail": "<sentence>"}`."""
    if isinstance(node, dict):
        if node.get("$ref") in _VALIDATION_REFS:
            return {"$ref": "#/components/schemas/ErrorBody"}
        return {key: _error_refs(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_error_refs(value) for value in node]
    return node


def openapi_document(app: FastAPI) -> dict[str, Any]:
    document: dict[str, Any] = _error_refs(
        get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
        )
    )
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["ErrorBody"] = ErrorBody.model_json_schema()
    return document


class BodyLimit:
    """Refuses request bodies over `limit` bytes with 413: by Content-Length at once,
    and for chunked bodies by reading at most `limit` bytes before the app sees any
    (the limit is small, so buffering the body costs nothing worth avoiding)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, receive, send)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away: let the app see it
            body += message.get("body", b"")
            if len(body) > self.limit:
                await self._refuse(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse(
            {
                "detail": f"request body too large: the limit is {self.limit} bytes "
                "(setting max_request_bytes)"
            },
            status_code=413,
        )
        await response(scope, receive, send)


def create_app(service: RetryService) -> FastAPI:
    app = FastAPI(
        title="redrive",
        version=service.version,
        description="Retries and dead letters for Kafka consumers: the retry service's API.",
    )

    @app.exception_handler(RequestValidationError)
    def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _explain(list(exc.errors()))}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            return method_not_allowed(app, request, exc)
        return await http_exception_handler(request, exc)

    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = openapi_document(app)
        return app.openapi_schema

    app.openapi = document  # type: ignore[method-assign]

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        responses={
            200: {"description": "Ready: the store is reachable and every role healthy"},
            503: {"description": "Not ready; `checks` says which part is not"},
        },
    )
    def readyz() -> Response:
        checks: dict[str, Any] = service.readiness()
        ready = all(checks.values())
        return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)

    @app.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {
                "description": "Prometheus metrics in the text exposition format",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        },
    )
    def metrics() -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(create_router(service))
    mount_ui(app, service)
    app.add_middleware(BodyLimit, limit=service.settings.max_request_bytes)
    return app
