"""Search filters for dead letters, pending retries and the audit log, and their cursors: the API's
query models (validation, the OpenAPI document).

A filter is the store's search (:mod:`redrive.service.store.searches`, which makes it
SQL) as the API takes it. Pagination is by cursor (the sort key of the last row
seen), which stays correct while rows come and go, unlike offsets.

Every value is checked here for what PostgreSQL would refuse once the query runs (a
NUL in text, a lone surrogate that is not UTF-8, an integer beyond bigint), so a bad
filter is a refusal that names its field rather than a failed query; the same types
put those limits into the OpenAPI document.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    field_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from redrive.headers import MAX_TOPIC_LENGTH
from redrive.service.fingerprints import FINGERPRINT_PATTERN

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
# Text PostgreSQL can store: no NUL. (Lone surrogates are refused by `_storable`: a JSON
# Schema pattern cannot name them, and clients cannot send them in UTF-8 anyway.)
NO_NUL_PATTERN = r"^[^\x00]*$"
# The shape of the cursors this API returns (URL-safe base64); the content is checked
# when decoded.
CURSOR_PATTERN = r"^[A-Za-z0-9_-]{1,100}={0,2}$"
CURSOR_MAX_LENGTH = 102


class FilterError(ValueError):
    """A filter or cursor that cannot be used; the message says why."""


def unicode_text(value: str) -> str:
    """`value` if it can be encoded as UTF-8 (JSON can carry a lone surrogate, which
    neither PostgreSQL nor Kafka can take), else ValueError saying why."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (it holds a lone surrogate)") from None
    return value


def storable_text(value: str) -> str:
    """`value` if PostgreSQL can store and compare it as text, else ValueError saying why."""
    if "\x00" in value:
        raise ValueError("must not contain a NUL character (\\x00)")
    return unicode_text(value)


_ISO_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}")


def _iso_only(value: object) -> object:
    """Times as ISO 8601 text (or a datetime, from the UI) only: pydantic would also
    read a number as seconds since 1970, which the document does not offer."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and _ISO_DATE_TIME.match(value):
        return value
    raise ValueError("must be an ISO 8601 date and time, e.g. 2024-05-01T12:00:00Z")


def _aware(value: datetime | None) -> datetime | None:
    """A time without an offset is UTC (as the UI reads it): naive and aware times
    cannot be compared, and PostgreSQL would read a naive one in its own time zone."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


@dataclass(frozen=True, slots=True)
class SchemaPattern:
    """Puts a pattern on a string's JSON Schema only: the check itself is a validator,
    whose message says more than a pattern mismatch."""

    pattern: str

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {**handler(schema), "pattern": self.pattern}


def _after_since(until: datetime | None, info: Any) -> datetime | None:
    """A filter's time range: `until` after `since`, when both are given."""
    since = info.data.get("since")
    if until is not None and since is not None and until <= since:
        raise ValueError("until must be after since")
    return until


def _text(max_length: int, title: str, description: str | None = None) -> Any:
    return Field(None, max_length=max_length, title=title, description=description)


BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


def _base64(value: str) -> str:
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not base64: {exc}") from None
    return value


# Bytes given as base64 text (the check's message says more than the pattern's).
Base64Text = Annotated[str, AfterValidator(_base64), SchemaPattern(BASE64_PATTERN)]
# Text that ends up in SQL: no NUL, valid Unicode.
StorableText = Annotated[str, AfterValidator(storable_text), SchemaPattern(NO_NUL_PATTERN)]
# Text that goes to Kafka as UTF-8 (a payload may hold NUL).
UnicodeText = Annotated[str, AfterValidator(unicode_text)]
# A time filter: naive times are UTC.
FilterTime = Annotated[datetime, BeforeValidator(_iso_only), AfterValidator(_aware)]
# The id of a row (bigserial: a positive bigint).
RowId = Annotated[int, Field(ge=1, le=INT64_MAX)]


# The models' docstrings are their descriptions in the OpenAPI document. Each filter
# is a search of the store (store/searches.py), which makes it SQL.


class DeadLetterFilter(BaseModel):
    """Which dead letters: every given field must match (AND)."""

    # Every page, form, job description and link takes its fields from here (with each
    # field's title as its label: redrive.service.web.params), so a filter the API
    # honours cannot be dropped on the way through the UI.
    model_config = ConfigDict(extra="forbid")

    topic: StorableText | None = _text(MAX_TOPIC_LENGTH, "topic")
    group: StorableText | None = _text(1024, "group")
    error_type: StorableText | None = _text(1024, "error type")
    text: StorableText | None = _text(
        1024, "error text", "Found anywhere in the error message (any case)."
    )
    reason: StorableText | None = _text(
        1024, "reason", "A reason code, or text found in the reason."
    )
    source: StorableText | None = _text(
        64,
        "source",
        "Who made it a dead letter: intake, scheduler, or ingest:<format> (redrive, "
        "spring, connect, raw) for one ingested from a dead-letter topic.",
    )
    ingested_from: StorableText | None = _text(
        MAX_TOPIC_LENGTH, "ingested from", "The dead-letter topic it was ingested from."
    )
    since: FilterTime | None = Field(
        None,
        title="since",
        description="Dead since this time (ISO 8601; without an offset: UTC).",
    )
    until: FilterTime | None = Field(
        None,
        title="until",
        description="Dead before this time (ISO 8601; without an offset: UTC).",
    )
    error_group: str | None = Field(
        None,
        title="error group",
        pattern=FINGERPRINT_PATTERN,
        description="The error group it is in (16 hex digits: GET /error-groups).",
    )

    _ordered = field_validator("until")(_after_since)

    def is_empty(self) -> bool:
        return all(v is None for v in self.model_dump().values())


class PendingFilter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    destination: StorableText | None = _text(MAX_TOPIC_LENGTH, "destination")
    group: StorableText | None = _text(1024, "group")
    due_after_ms: int | None = Field(None, ge=0, le=INT64_MAX)
    due_before_ms: int | None = Field(None, ge=0, le=INT64_MAX)


class AuditFilter(BaseModel):
    """Which audit entries: every given field must match (AND)."""

    # The audit page's form takes its fields and labels from here, as the dead-letter
    # list does from DeadLetterFilter.
    model_config = ConfigDict(extra="forbid")

    actor: StorableText | None = _text(256, "who", "The token name that acted (exact).")
    action: StorableText | None = _text(
        64, "action", "What was done (exact): replay, replay-job, delete, mute-group, …"
    )
    letter: RowId | None = Field(
        None, title="dead letter", description="Entries naming this dead letter's id."
    )
    since: FilterTime | None = Field(
        None, title="since", description="At or after this time (ISO 8601; without an offset: UTC)."
    )
    until: FilterTime | None = Field(
        None, title="until", description="Before this time (ISO 8601; without an offset: UTC)."
    )

    _ordered = field_validator("until")(_after_since)


def encode_cursor(*parts: int) -> str:
    return base64.urlsafe_b64encode(":".join(str(p) for p in parts).encode()).decode()


def decode_cursor(cursor: str, count: int) -> tuple[int, ...]:
    """The sort key in a cursor; FilterError for anything this API did not return
    (including numbers beyond bigint, which PostgreSQL would refuse)."""
    refused = FilterError(f"cursor {cursor[:40]!r} is not one this API returned")
    try:
        text = base64.urlsafe_b64decode(cursor.encode("ascii")).decode("ascii")
        parts = tuple(int(p) for p in text.split(":"))
    except (ValueError, binascii.Error):  # UnicodeError is a ValueError
        raise refused from None
    if len(parts) != count or not all(INT64_MIN <= p <= INT64_MAX for p in parts):
        raise refused
    return parts


class RecordQuery(BaseModel):
    """Where is my record? By its key, or by its original coordinates (a topic, and
    optionally its partition and offset). Each given field narrows the search;
    :meth:`problem` says what a search that cannot be run lacks (JSON Schema cannot
    state a rule across query parameters: it is a 400, not a 422)."""

    model_config = ConfigDict(extra="forbid")

    key: UnicodeText | None = Field(None, max_length=4096, description="The key, as UTF-8 text.")
    key_base64: Base64Text | None = Field(
        None, max_length=8192, description="The key's bytes in base64 (a key that is not text)."
    )
    topic: StorableText | None = _text(MAX_TOPIC_LENGTH, "topic", "The record's original topic.")
    partition: int | None = Field(None, ge=0, le=2**31 - 1)
    offset: int | None = Field(None, ge=0, le=INT64_MAX)

    def problem(self) -> str | None:
        if self.key is not None and self.key_base64 is not None:
            return "give key or key_base64, not both"
        if self.key is None and self.key_base64 is None and self.topic is None:
            return "give a key (key or key_base64) or an original topic"
        if self.topic is None and (self.partition is not None or self.offset is not None):
            return "partition and offset need the topic"
        return None

    def key_bytes(self) -> bytes | None:
        if self.key_base64 is not None:
            return base64.b64decode(self.key_base64, validate=True)
        return None if self.key is None else self.key.encode()
