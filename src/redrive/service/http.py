"""The service's HTTP server: the REST API, the web UI, /metrics, /healthz, /readyz.

/healthz answers whenever the process serves HTTP (liveness). /readyz answers 200
only when the store is reachable and every role is healthy, 503 otherwise, with a
body saying which part is not ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from redrive.service.api import create_router
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

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    def readyz() -> Response:
        checks: dict[str, Any] = service.readiness()
        ready = all(checks.values())
        return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(create_router(service))
    mount_ui(app, service)
    app.add_middleware(BodyLimit, limit=service.settings.max_request_bytes)
    return app
