"""Reading the web UI's query strings and forms: fields, the dead-letter filter, safe
local URLs, and refusals as sentences an operator reads."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlencode

from fastapi import Request
from pydantic import BaseModel, ValidationError

from redrive.service.filters import DeadLetterFilter, FilterError
from redrive.service.refusals import ActionRefused
from redrive.service.store import Store

# The dead-letter filter's fields, as the API's model has them: the search form, the
# bulk forms' hidden fields, job descriptions and their links all take these.
FILTER_FIELDS = tuple(DeadLetterFilter.model_fields)
FILTER_LABELS = {name: f.title or name for name, f in DeadLetterFilter.model_fields.items()}

F = TypeVar("F", bound=BaseModel)

# What an operator action or a filter may refuse with; `explain` says why in a sentence.
REFUSALS = (ActionRefused, ValidationError, FilterError, ValueError)


def explain(exc: Exception) -> str:
    if isinstance(exc, ActionRefused):
        return exc.detail
    if isinstance(exc, ValidationError):
        parts = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error.get("loc", ()))
            msg = str(error.get("msg", "invalid")).removeprefix("Value error, ")
            parts.append(f"{FILTER_LABELS.get(where, where)}: {msg}" if where else msg)
        return "; ".join(parts)
    return str(exc)


def field(form: Mapping[str, Any], name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


def confirmed(form: Mapping[str, Any]) -> bool:
    return field(form, "confirmed") == "1"


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


def query(**params: str | None) -> str:
    kept = {k: v for k, v in params.items() if v}
    return "?" + urlencode(kept) if kept else ""


def here(request: Request) -> str:
    q = request.url.query
    return request.url.path + (f"?{q}" if q else "")


def _parse_time(name: str, text: str) -> datetime:
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{name}: {text!r} is not a date and time (YYYY-MM-DDTHH:MM)") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def form_filter(model: type[F], values: Mapping[str, Any]) -> tuple[F, dict[str, str]]:
    """The filter `model` of a query string or form, and its raw field values (every
    field of the model, "" when not given); raises ValueError with a readable message."""
    raw = {name: field(values, name) for name in model.model_fields}
    args: dict[str, Any] = {k: v for k, v in raw.items() if v}
    for name in ("since", "until"):
        if name in args:
            args[name] = _parse_time(name, args[name])
    try:
        return model(**args), raw
    except ValidationError as exc:
        raise ValueError(explain(exc)) from None


def dead_letter_filter(values: Mapping[str, Any]) -> tuple[DeadLetterFilter, dict[str, str]]:
    """The dead-letter filter of a query string or form (:func:`form_filter`)."""
    return form_filter(DeadLetterFilter, values)


def describe_filter(raw: Mapping[str, str], group_title: str | None = None) -> str:
    """The filter in words; an error group by its id and, if given, its title."""
    parts = []
    for name in FILTER_FIELDS:
        if raw.get(name):
            said = f"{FILTER_LABELS[name]} {raw[name]!r}"
            if name == "error_group" and group_title:
                said += f" ({group_title})"
            parts.append(said)
    return ", ".join(parts)


def described_in(store: Store, raw: Mapping[str, str]) -> str:
    """The filter in words, an error group named by its title while it has letters."""
    group = raw.get("error_group")
    found = store.error_group(group) if group else None
    return describe_filter(raw, found.title if found else None)


def plural(count: int, word: str) -> str:
    return f"{count:,} {word}" + ("" if count == 1 else "s")
