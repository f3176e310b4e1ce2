"""/healthz, /readyz and /metrics: for the orchestrator and Prometheus.

/healthz answers whenever the process serves HTTP (liveness). /readyz answers 200
only when the store is reachable and every role is healthy, 503 otherwise, with a
body saying which part is not ready.
"""

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from redrive.service.web.deps import collaborators

router = APIRouter()


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    responses={
        200: {"description": "Ready: the store is reachable and every role healthy"},
        503: {"description": "Not ready; `checks` says which part is not"},
    },
)
def readyz(request: Request) -> Response:
    checks: dict[str, Any] = collaborators(request).readiness()
    ready = all(checks.values())
    return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus metrics in the text exposition format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
)
def metrics(request: Request) -> Response:
    registry = collaborators(request).registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
