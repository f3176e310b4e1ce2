"""What operators do, whoever asks: the REST API and the web UI call these.

Each action checks its input, does the work, writes the audit entry, and returns
what it did; a refusal is an ActionRefused of the kind that says why it was not done
(:mod:`.refusals`: not found, conflict, invalid, not acknowledged), with a sentence.
The caller has already established who asks and that their role allows it. The
actions are given the few things they use (the store, the operator queries, the
replayer, a way to wake the scheduler, two limits), not the service.
"""

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    model_validator,
)

from redrive.clock import now_ms
from redrive.headers import MAX_TOPIC_LENGTH
from redrive.service.auth import Principal
from redrive.service.filters import (
    Base64Text,
    DeadLetterFilter,
    FilterTime,
    RowId,
    StorableText,
    UnicodeText,
)
from redrive.service.operations import Operations
from redrive.service.refusals import Conflict, Invalid, NotAcknowledged, NotFound
from redrive.service.replay import Edit, Replayer, ReplayRefused
from redrive.service.replay_guard import quarantine_reason
from redrive.service.replay_preview import Preview, preview
from redrive.service.store import DeadLetter, JobOverlap, ReplayJob, Store
from redrive.service.unknown_records import unknown_record_reason

# ------------------------------------------------------------------ request bodies (API and UI)
#
# The model validators below are restated as JSON Schema (`json_schema_extra`), so the
# OpenAPI document refuses exactly the bodies the handlers refuse.


def _given(name: str, kind: str) -> dict[str, Any]:
    """JSON Schema: `name` is present and not null."""
    return {"required": [name], "properties": {name: {"type": kind}}}


class Payload(BaseModel):
    """Bytes given as exactly one of: UTF-8 text, base64, or a JSON value."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [
                _given("text", "string"),
                _given("base64", "string"),
                {"required": ["json"]},
            ]
        },
    )
    text: UnicodeText | None = None
    base64: Base64Text | None = None
    json_value: Any = Field(None, alias="json")

    @model_validator(mode="after")
    def _one(self) -> "Payload":
        given = [
            self.text is not None,
            self.base64 is not None,
            "json_value" in self.model_fields_set,
        ]
        if sum(given) != 1:
            raise ValueError("give exactly one of text, base64 or json")
        return self

    def to_bytes(self) -> bytes:
        if self.text is not None:
            return self.text.encode()
        if self.base64 is not None:
            return base64.b64decode(self.base64)
        return json.dumps(self.json_value).encode()


class HeaderIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # No NUL: the Kafka client would cut the name there.
    name: StorableText = Field(min_length=1, max_length=255)
    value: Payload | None = None


# A topic name goes to the allowlist, the Kafka client (which would cut it at a NUL)
# and the audit log (PostgreSQL).
Destination = StorableText


class ReplayOne(BaseModel):
    model_config = ConfigDict(extra="forbid")
    destination: Destination | None = Field(
        None, max_length=MAX_TOPIC_LENGTH, description="Default: its topic."
    )
    value: Payload | None = Field(None, description="Edit the value before replaying.")
    headers: list[HeaderIn] | None = Field(None, max_length=100, description="Replace headers.")
    # Flags are strict (JSON true or false): pydantic would also take 0, 1, "yes" and
    # "off", which the document does not offer.
    keep: StrictBool = Field(False, description="Keep the dead letter after replaying it.")
    override_quarantine: StrictBool = Field(
        False,
        description="Replay it although the loop guard quarantined it (it came back dead "
        "after quarantine_after_replays replays); recorded in the audit log.",
    )

    def edit(self) -> Edit | None:
        """What the body changes before the replay (None: nothing)."""
        if self.value is None and self.headers is None:
            return None
        return Edit(
            value=self.value.to_bytes() if self.value is not None else None,
            headers=None
            if self.headers is None
            else [(h.name, None if h.value is None else h.value.to_bytes()) for h in self.headers],
        )


class Selection(BaseModel):
    """Dead letters by id, or everything a filter matches (`all` for an empty filter)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [_given("ids", "array"), _given("filter", "object")],
            # A filter whose every field is null or absent matches everything.
            "if": {
                "required": ["filter"],
                "properties": {
                    "filter": {"type": "object", "additionalProperties": {"type": "null"}}
                },
            },
            "then": {"required": ["all"], "properties": {"all": {"const": True}}},
        },
    )
    ids: list[RowId] | None = Field(None, max_length=10_000)
    filter: DeadLetterFilter | None = None
    all: StrictBool = False

    @model_validator(mode="after")
    def _chosen(self) -> "Selection":
        if (self.ids is None) == (self.filter is None):
            raise ValueError("give either ids or filter")
        if self.filter is not None and self.filter.is_empty() and not self.all:
            raise ValueError("an empty filter matches every dead letter: set all=true to mean it")
        return self


MAX_SCHEDULE_DAYS = 366
"""How far ahead a replay job may be scheduled."""


class ReplaySettings(BaseModel):
    """How a replay of many letters runs: where to, at what pace, from when, and
    whether the letters are kept (a bulk replay's and a group replay's)."""

    model_config = ConfigDict(extra="forbid")
    destination: Destination | None = Field(
        None, max_length=MAX_TOPIC_LENGTH, description="Default: each letter's topic."
    )
    keep: StrictBool = Field(False, description="Keep the dead letters after replaying them.")
    # At least one a second: slower, a job of the largest selection would run for days.
    rate: float | None = Field(None, ge=1, le=100_000, description="Messages per second.")
    start_at: FilterTime | None = Field(
        None,
        description="Start the job at this time (ISO 8601; without an offset: UTC); until "
        "then it is scheduled, and may be cancelled. Absent or past: at once. Not before "
        f"1970 nor more than {MAX_SCHEDULE_DAYS} days ahead (400).",
    )


class ReplayMany(Selection, ReplaySettings):
    """A replay job over a selection, with its settings."""


def _schedule_time(at: datetime | None) -> datetime | None:
    """A job's start time in UTC, if one it may wait for: not before 1970, nor years
    ahead (a typo in the year would hold its letters for ever); Invalid otherwise."""
    if at is None:
        return None
    try:
        utc = at.astimezone(UTC)
    except OverflowError:
        utc = None
    latest = datetime.now(UTC) + timedelta(days=MAX_SCHEDULE_DAYS)
    if utc is None or not datetime(1970, 1, 1, tzinfo=UTC) <= utc <= latest:
        raise Invalid(f"start_at must be between 1970 and {MAX_SCHEDULE_DAYS} days from now")
    return utc


@dataclass(frozen=True, slots=True)
class JobStarted:
    """A replay job just started, and how many more letters matched than it took (a
    selection is capped at `replay_max_per_request`)."""

    job: ReplayJob
    remaining: int


def passed_over(letter: DeadLetter) -> str | None:
    """Why a replay job (and its dry run) skips the letter (None: it sends it)."""
    return quarantine_reason(letter) or unknown_record_reason(letter)


class OperatorActions:
    def __init__(
        self,
        store: Store,
        operations: Operations,
        replayer: Replayer,
        wake_scheduler: Callable[[], None],
        wake_replay_jobs: Callable[[], None],
        *,
        replay_rate_per_second: float,
        replay_max_per_request: int,
    ) -> None:
        self._store = store
        self._ops = operations
        self._replayer = replayer
        self._wake_scheduler = wake_scheduler
        self._wake_replay_jobs = wake_replay_jobs
        self._rate_per_second = replay_rate_per_second
        self._max_per_request = replay_max_per_request

    def replay_one(
        self, who: Principal, letter_id: int, body: ReplayOne | None = None
    ) -> dict[str, Any]:
        body = body or ReplayOne()
        row = self._store.dead_letter_by_id(letter_id)
        if row is None:
            raise NotFound(f"no dead letter {letter_id}")
        if (live := self._store.replay_jobs.live_job_of([letter_id])) is not None:
            raise Conflict(f"dead letter {letter_id} is still to be sent by replay job {live[0]}")
        if (why := quarantine_reason(row)) is not None and not body.override_quarantine:
            raise Conflict(f"dead letter {letter_id} is {why} (override_quarantine)")
        edit = body.edit()
        if (why := unknown_record_reason(row, edit)) is not None:
            raise Conflict(f"dead letter {letter_id}: {why}")
        try:
            target = self._replayer.replay(row, destination=body.destination, edit=edit)
        except ReplayRefused as exc:
            raise Invalid(str(exc)) from None
        if target is None:
            raise NotAcknowledged(f"the broker did not acknowledge dead letter {letter_id}")
        self._store.replayed(
            letter_id,
            actor=who.name,
            topic=target.topic,
            partition=target.partition,
            delete=not body.keep,
        )
        detail: dict[str, Any] = {
            "destination": body.destination,
            "kept": body.keep,
            "edited": edit is not None,
            "round": row.replays + 1,
        }
        if row.quarantined:
            detail["override_quarantine"] = True
        self._ops.audit(
            actor=who.name,
            role=who.role,
            action="edit-and-replay" if edit else "replay",
            ids=[letter_id],
            count=1,
            detail=detail,
        )
        return {"replayed": 1, "ids": [letter_id], "failed": []}

    def dry_run_one(self, who: Principal, letter_id: int, body: ReplayOne | None = None) -> Preview:
        """What replaying the letter would send (:mod:`.replay_preview`); audited."""
        body = body or ReplayOne()
        row = self._store.dead_letter_by_id(letter_id)
        if row is None:
            raise NotFound(f"no dead letter {letter_id}")
        edit = body.edit()

        def skip(letter: DeadLetter) -> str | None:
            quarantined = None if body.override_quarantine else quarantine_reason(letter)
            return quarantined or unknown_record_reason(letter, edit)

        shown = preview(
            [row],
            target_of=lambda letter: self._replayer.target_of(letter, body.destination),
            skip=skip,
            edit=edit,
        )
        if (live := self._store.replay_jobs.live_job_of([letter_id])) is not None:
            shown.conflict = f"dead letter {letter_id} is still to be sent by replay job {live[0]}"
        self._audit_dry_run(who, [letter_id], None, shown, body.destination)
        return shown

    def dry_run_many(self, who: Principal, body: ReplayMany) -> Preview:
        """What a replay job over the selection would send; audited, nothing else."""
        rows, remaining = self._select(body)
        found = {r.id for r in rows}
        shown = preview(
            rows,
            target_of=lambda letter: self._replayer.target_of(letter, body.destination),
            skip=passed_over,
            missing=[i for i in body.ids or () if i not in found],
        )
        shown.remaining = remaining
        if rows and (live := self._store.replay_jobs.live_job_of(sorted(found))) is not None:
            shown.conflict = (
                f"{live[1]} of these dead letters are still to be sent by replay job {live[0]}"
            )
        self._audit_dry_run(who, sorted(found), body.filter, shown, body.destination)
        return shown

    def _audit_dry_run(
        self,
        who: Principal,
        ids: list[int],
        flt: DeadLetterFilter | None,
        shown: Preview,
        destination: str | None,
    ) -> None:
        self._ops.audit(
            actor=who.name,
            role=who.role,
            action="replay-dry-run",
            ids=ids,
            flt=flt,
            count=shown.would_send,
            detail={
                "destination": destination,
                "selected": shown.selected,
                "would_send": shown.would_send,
                "refused": len(shown.refused),
                "skipped": len(shown.skipped),
            },
        )

    def _select(self, selection: Selection) -> tuple[list[DeadLetter], int]:
        store = self._store
        if selection.ids is not None:
            return store.dead_letters_by_id(selection.ids), 0
        assert selection.filter is not None
        ids = store.dead_letter_ids(selection.filter, limit=self._max_per_request)
        total = store.count_dead_letters(selection.filter)
        return store.dead_letters_by_id(ids), max(total - len(ids), 0)

    def replay_many(self, who: Principal, body: ReplayMany) -> JobStarted:
        """Start a replay job (:mod:`redrive.service.replay_jobs`) over the selection,
        after checking every destination; it runs in the background."""
        ops = self._ops
        start_at = _schedule_time(body.start_at)
        rows, remaining = self._select(body)
        if not rows:
            raise Invalid("nothing to replay: no dead letter matches")
        try:
            for row in rows:
                if passed_over(row) is None:  # passed over: its topic may be gone
                    self._replayer.target_of(row, body.destination)
        except ReplayRefused as exc:
            raise Invalid(str(exc)) from None
        ids = [r.id for r in rows]
        skipped = {r.id: why for r in rows if (why := passed_over(r)) is not None}
        rate = body.rate or self._rate_per_second
        try:
            job_id = self._store.replay_jobs.create(
                skipped=skipped,
                start_at=start_at,
                actor=who.name,
                role=who.role,
                destination=body.destination,
                keep=body.keep,
                rate=rate,
                filter_json=None
                if body.filter is None
                else body.filter.model_dump_json(exclude_none=True),
                ids=ids,
            )
        except JobOverlap as exc:
            raise Conflict(f"{exc}: wait for it to end, or cancel it") from None
        job = self._store.replay_jobs.get(job_id, with_failures=True)
        assert job is not None
        ops.audit(
            actor=who.name,
            role=who.role,
            action="schedule-replay-job" if job.state == "scheduled" else "replay-job",
            ids=ids,
            flt=body.filter,
            count=len(ids),
            detail={
                "job": job_id,
                "destination": body.destination,
                "kept": body.keep,
                "rate": rate,
                "start_at": None if job.start_at is None else job.start_at.isoformat(),
                "skipped": len(skipped),
            },
        )
        self._wake_replay_jobs()
        return JobStarted(job, remaining)

    def cancel_replay_job(self, who: Principal, job_id: int) -> ReplayJob:
        """Cancel a running or scheduled job; answers the job as it is then."""
        ops = self._ops
        before = self._store.replay_jobs.cancel(job_id, who.name)
        if before is None:
            raise NotFound(f"no replay job {job_id}")
        if before not in ("running", "scheduled"):
            raise Conflict(f"replay job {job_id} is {before} already")
        job = self._store.replay_jobs.get(job_id, with_failures=True)
        assert job is not None
        ops.audit(
            actor=who.name,
            role=who.role,
            action="cancel-replay-job",
            count=job.cancelled,
            detail={"job": job_id, "sent": job.sent, "was": before},
        )
        return job

    def delete_one(self, who: Principal, letter_id: int) -> dict[str, Any]:
        deleted = self._store.delete_dead_letters([letter_id])
        if not deleted:
            raise NotFound(f"no dead letter {letter_id}")
        self._ops.audit(actor=who.name, role=who.role, action="delete", ids=deleted, count=1)
        return {"deleted": 1, "ids": deleted}

    def delete_many(self, who: Principal, body: Selection) -> dict[str, Any]:
        ops = self._ops
        if body.ids is not None:
            ids = body.ids
        else:
            assert body.filter is not None
            ids = self._store.dead_letter_ids(body.filter, limit=1_000_000)
        deleted = self._store.delete_dead_letters(ids)
        ops.audit(
            actor=who.name,
            role=who.role,
            action="delete",
            ids=deleted,
            flt=body.filter,
            count=len(deleted),
        )
        return {"deleted": len(deleted), "ids": deleted}

    def retry_now(self, who: Principal, pending_id: int) -> dict[str, Any]:
        ops = self._ops
        if not ops.retry_now(pending_id, now_ms()):
            raise NotFound(f"no pending retry {pending_id} (delivered or cancelled?)")
        self._wake_scheduler()
        ops.audit(actor=who.name, role=who.role, action="retry-now", ids=[pending_id], count=1)
        return {"retried": 1, "id": pending_id}

    def cancel(self, who: Principal, pending_id: int) -> dict[str, Any]:
        ops = self._ops
        if not ops.cancel(pending_id, who.name):
            raise NotFound(f"no pending retry {pending_id} (delivered or cancelled?)")
        ops.audit(actor=who.name, role=who.role, action="cancel", ids=[pending_id], count=1)
        return {"cancelled": 1, "id": pending_id}
