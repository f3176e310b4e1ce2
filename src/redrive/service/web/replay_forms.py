"""The web UI's replay previews (dry runs): the "Preview" buttons of the replay forms.

The bulk form's preview buttons (selected letters, or all matching) and a dead
letter's own preview post here, through the same checks as every action form
(:func:`.forms.form_action`: CSRF, an operator's session), and are answered with a
page saying what the replay would send where (:mod:`redrive.service.replay_preview`,
the dry run the API answers too); nothing is sent or changed but the audit log.
"""

from fastapi.responses import Response
from pydantic import ValidationError

from redrive.service.actions import ReplayMany, ReplayOne
from redrive.service.replay_preview import Preview
from redrive.service.web.forms import Posted, form_action, selection_of, start_time
from redrive.service.web.params import REFUSALS, explain, local_url, query
from redrive.service.web.representations import preview_view


def _shown(p: Posted, shown: Preview, what: str, back: str) -> Response:
    return p.pages.render(
        p.request,
        "replay_preview.html",
        p.who,
        nav="dead-letters",
        preview=preview_view(shown),
        what=what,
        back=back,
    )


@form_action("/dead-letters/preview")
def preview_many(p: Posted) -> Response:
    back = local_url(p.field("back"), "/dead-letters", "/dead-letters")
    try:
        body, what = selection_of(p, "selected" if p.field("scope") == "selected" else "matching")
        start_at = start_time(p)
    except ValueError as exc:
        return p.redirect(back, "error", str(exc))
    try:
        shown = p.actions.dry_run_many(p.who, ReplayMany(**body, start_at=start_at))
    except ValidationError as exc:
        return p.redirect(back, "error", explain(exc))
    except REFUSALS as exc:
        return p.redirect(back, "error", f"Preview refused: {explain(exc)}")
    return _shown(p, shown, f"Replaying {what}", back)


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
    return _shown(p, shown, f"Replaying dead letter {letter_id}", here)
