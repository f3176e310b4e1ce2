"""The retry service's web wing: the REST API and the web UI on one FastAPI app.

Laid out as FastAPI's "bigger applications": module-level routers whose routes ask
for the few collaborators they need through dependencies.

- app.py: `create_app`, the one entry (the service calls it); shared error rules,
  among them the HTTP status of each kind of refused action
- deps.py: the collaborators on `app.state` and the dependencies handing them out
- api.py: the REST API under /api/v1 (replay_api.py: its dry runs and replay rounds);
  openapi.py: its document
- probes.py: /healthz, /readyz, /metrics; limits.py: the request body limit
- pages.py (GET) and forms.py (POST): the web UI (replay_forms.py: replay previews);
  templating.py renders its pages, session.py keeps its session, CSRF guard and
  messages; params.py reads its forms; formatting.py and charts.py shape what it shows
- representations.py: the store's read models (dead letters, pending retries, replay
  jobs, the audit log) as the API and the UI show them

Operator actions (replay, delete, retry now, cancel) are in redrive.service.actions,
the same for the API and the UI.
"""

from redrive.service.web.app import create_app

__all__ = ["create_app"]
