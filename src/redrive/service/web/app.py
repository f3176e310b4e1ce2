"""The service's HTTP app: the REST API, the web UI, /metrics, /healthz, /readyz.

`create_app` is the one entry: it takes from the retry service, once, the few things
the routes use (`Collaborators`, kept on `app.state`, handed out by deps.py), includes
the module-level routers, and installs the rules every route shares: refusals as
`{"detail": "<sentence>"}` with the HTTP status of their kind (`STATUS_OF`, the one
place the domain's refusals become statuses), a 405 naming every allowed method,
the body limit.
"""

from pathlib import Path
from typing import Any, Protocol

from fastapi import FastAPI, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Mount
from starlette.types import Scope

from redrive.service.actions import OperatorActions
from redrive.service.auth import Tokens
from redrive.service.config import ServiceSettings
from redrive.service.filters import FilterError
from redrive.service.operations import Operations
from redrive.service.refusals import ActionRefused, Conflict, Invalid, NotAcknowledged, NotFound
from redrive.service.replay import Replayer
from redrive.service.web import (
    api,
    audit_pages,
    delete_preview,  # noqa: F401  (adds its form action to forms.router)
    forms,
    groups_api,
    groups_pages,
    job_pages,
    pages,
    probes,
    replay_api,
    replay_forms,  # noqa: F401  (adds its form actions to forms.router)
)
from redrive.service.web.deps import Collaborators
from redrive.service.web.limits import BodyLimit
from redrive.service.web.openapi import openapi_document
from redrive.service.web.templating import Pages

STATIC = Path(__file__).resolve().parent.parent / "static"


class Service(Protocol):
    """What the web wing takes from the retry service when the app is created."""

    @property
    def version(self) -> str: ...
    @property
    def settings(self) -> ServiceSettings: ...
    @property
    def operations(self) -> Operations: ...
    @property
    def tokens(self) -> Tokens: ...
    @property
    def replayer(self) -> Replayer: ...
    @property
    def exposed_metrics(self) -> CollectorRegistry: ...
    def readiness(self) -> dict[str, bool]: ...
    def wake_scheduler(self) -> None: ...
    def wake_replay_jobs(self) -> None: ...


class ServiceApp(FastAPI):
    """FastAPI with the service's OpenAPI document (openapi.py)."""

    # Whether reads need no token, as the settings said when the app was made.
    reads_open = True

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            self.openapi_schema = openapi_document(self, reads_open=self.reads_open)
        return self.openapi_schema


def collaborators_of(service: Service) -> Collaborators:
    settings, operations = service.settings, service.operations
    store = operations.store
    return Collaborators(
        settings=settings,
        store=store,
        operations=operations,
        tokens=service.tokens,
        actions=OperatorActions(
            store,
            operations,
            service.replayer,
            service.wake_scheduler,
            service.wake_replay_jobs,
            replay_rate_per_second=settings.replay_rate_per_second,
            replay_max_per_request=settings.replay_max_per_request,
        ),
        pages=Pages(store.totals, settings, service.version),
        registry=service.exposed_metrics,
        readiness=service.readiness,
    )


def create_app(service: Service) -> FastAPI:
    app = ServiceApp(
        title="redrive",
        version=service.version,
        description="Retries and dead letters for Kafka consumers: the retry service's API.",
    )
    app.reads_open = not service.settings.require_token_for_reads
    app.state.collaborators = collaborators_of(service)

    @app.exception_handler(RequestValidationError)
    def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _explain(list(exc.errors()))}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            return method_not_allowed(app, request, exc)
        return await http_exception_handler(request, exc)

    app.add_exception_handler(ActionRefused, _action_refused)
    app.add_exception_handler(FilterError, _filter_refused)
    app.add_exception_handler(pages.PageRefused, pages.page_refused)

    app.include_router(probes.router)
    app.include_router(api.router)
    app.include_router(groups_api.router)
    app.include_router(replay_api.router)
    app.include_router(pages.router)
    app.include_router(groups_pages.router)
    app.include_router(job_pages.router)
    app.include_router(audit_pages.router)
    app.include_router(forms.router)  # with the group forms (groups_pages, imported above)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_middleware(BodyLimit, limit=service.settings.max_request_bytes)
    return app


STATUS_OF: dict[type[ActionRefused], int] = {
    Invalid: 400,
    NotFound: 404,
    Conflict: 409,
    # The broker is the server behind this one, and it failed: a bad gateway.
    NotAcknowledged: 502,
}


def status_of(refusal: ActionRefused) -> int:
    """The HTTP status a refusal is answered with, by its kind."""
    return next(status for kind, status in STATUS_OF.items() if isinstance(refusal, kind))


def _action_refused(request: Request, exc: Exception) -> Response:
    """An operator action refused through the API (by the action, or by a key queue's
    order): the status of its kind, and its sentence."""
    assert isinstance(exc, ActionRefused)
    return JSONResponse({"detail": exc.detail}, status_code=status_of(exc))


def _filter_refused(request: Request, exc: Exception) -> Response:
    """A cursor this API did not return."""
    return JSONResponse({"detail": str(exc)}, status_code=400)


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
