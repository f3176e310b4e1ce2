"""The web UI's replay previews (dry runs): the "Preview" buttons of the replay forms.

The bulk form's preview buttons (selected letters, or all matching), an error group's
and a dead letter's own preview post here, through the same checks as every action
form (:func:`.forms.form_action`: CSRF, an operator's session), and are answered with
a page saying what the replay would send where (:mod:`redrive.service.replay_preview`,
the dry run the API answers too); nothing is sent or changed but the audit log.

The preview page ends with the replay it previewed: a form carrying the very fields
the preview was asked with (the selection and the replay's settings,
:mod:`.replay_settings`), so the replay that runs is of the selection that was
counted, with the settings that were shown.
"""

from dataclasses import dataclass

from fastapi.responses import Response
from pydantic import ValidationError

from redrive.service.actions import ReplayMany, ReplayOne
from redrive.service.replay_preview import Preview
from redrive.service.web.forms import Posted, form_action, selection_of
from redrive.service.web.params import FILTER_FIELDS, REFUSALS, explain, local_url, query
from redrive.service.web.replay_settings import SETTING_FIELDS, replay_settings, settings_in_words
from redrive.service.web.representations import preview_view

# What a bulk preview was asked with, besides the filter's fields.
_BULK_FIELDS = ("ids", "all", *SETTING_FIELDS)
_ONE_FIELDS = ("destination", "keep", "override_quarantine")


@dataclass(frozen=True)
class PreviewStep:
    """The form that runs the previewed action (a replay, a delete): where it posts,
    and its fields."""

    action: str
    fields: list[tuple[str, str]]


def carried(p: Posted, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """The posted fields among `names`, each value as sent (a list field repeated)."""
    return [
        (name, value)
        for name in names
        for value in p.form.getlist(name)
        if isinstance(value, str) and value.strip()
    ]


def _shown(p: Posted, shown: Preview, what: str, back: str, step: PreviewStep) -> Response:
    return p.pages.render(
        p.request,
        "replay_preview.html",
        p.who,
        nav="dead-letters",
        preview=preview_view(shown),
        what=what,
        back=back,
        step=step,
    )


@form_action("/dead-letters/preview")
def preview_many(p: Posted) -> Response:
    back = local_url(p.field("back"), "/dead-letters")
    try:
        body, what = selection_of(p, "selected" if p.field("scope") == "selected" else "matching")
        settings = replay_settings(p.form)
    except ValueError as exc:
        return p.redirect(back, "error", str(exc))
    try:
        shown = p.actions.dry_run_many(p.who, ReplayMany(**body, **settings))
    except ValidationError as exc:
        return p.redirect(back, "error", explain(exc))
    except REFUSALS as exc:
        return p.redirect(back, "error", f"Preview refused: {explain(exc)}")
    scope = "selected" if "ids" in body else "matching"
    step = PreviewStep(
        "/dead-letters/bulk",
        [("op", f"replay:{scope}"), ("back", back), *carried(p, FILTER_FIELDS + _BULK_FIELDS)],
    )
    return _shown(p, shown, f"Replaying {what}{settings_in_words(settings)}", back, step)


@form_action("/dead-letters/{letter_id:int}/preview")
def preview_one(p: Posted) -> Response:
    letter_id = p.path_id("letter_id")
    back = local_url(p.field("back"), "/dead-letters", "/dead-letters")
    here = f"/dead-letters/{letter_id}" + query(back=back)
    try:
        body = ReplayOne(
            destination=p.field("destination") or None,
            keep=p.field("keep") == "1",
            override_quarantine=p.field("override_quarantine") == "1",
        )
        shown = p.actions.dry_run_one(p.who, letter_id, body)
    except ValidationError as exc:
        return p.redirect(here, "error", explain(exc))
    except REFUSALS as exc:
        return p.redirect(here, "error", f"Preview refused: {explain(exc)}")
    step = PreviewStep(
        f"/dead-letters/{letter_id}/replay", [("back", back), *carried(p, _ONE_FIELDS)]
    )
    return _shown(p, shown, f"Replaying dead letter {letter_id}", here, step)
