"""The service's HTTP endpoints: /metrics, /healthz, /readyz.

/healthz answers whenever the process serves HTTP (liveness). /readyz answers 200
only when the store is reachable and every role is healthy, 503 otherwise, with a
body saying which part is not ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

if TYPE_CHECKING:
    from redrive.service.service import RetryService


def create_app(service: RetryService) -> FastAPI:
    app = FastAPI(title="redrive", version=service.version)

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

    return app
