"""The OpenAPI document at /openapi.json, as FastAPI writes it with two changes:

- a refusal of a malformed request (422) is described by ErrorBody, as the app's
  handler answers `{"detail": "<sentence>"}`, not by FastAPI's list of errors;
- reads (the routes marked OPEN_READ) carry an optional, empty security requirement
  next to the bearer one unless `require_token_for_reads`.
"""

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from redrive.service.web.api import OPEN_READ, ErrorBody

_VALIDATION_REFS = ("#/components/schemas/HTTPValidationError",)


def _error_refs(node: Any) -> Any:
    """The document with FastAPI's list-of-errors 422 replaced by ErrorBody."""
    if isinstance(node, dict):
        if node.get("$ref") in _VALIDATION_REFS:
            return {"$ref": "#/components/schemas/ErrorBody"}
        return {key: _error_refs(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_error_refs(value) for value in node]
    return node


def _open_reads(document: dict[str, Any], reads_open: bool) -> None:
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            if isinstance(operation, dict) and operation.pop(OPEN_READ, False) and reads_open:
                operation["security"] = [*operation.get("security", []), {}]


def openapi_document(app: FastAPI, *, reads_open: bool) -> dict[str, Any]:
    document: dict[str, Any] = _error_refs(
        get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
        )
    )
    _open_reads(document, reads_open)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["ErrorBody"] = ErrorBody.model_json_schema()
    return document
