"""The web UI's delete previews: what a bulk delete would take, before it runs.

The list's bulk form ("Delete selected…", "Delete all N…") and an error group's
"Preview delete" post here, through the checks of every action form
(:func:`.forms.form_action`), and are answered with a page saying how many letters
the delete would take, from which topics, with the newest of them listed. Nothing is
deleted. The page ends with the delete it previewed ("Delete these N"), carrying the
very selection that was counted to the bulk form's action, which deletes exactly the
letters that selection then matches.
"""

from collections import Counter

from fastapi.responses import Response

from redrive.service.filters import DeadLetterFilter
from redrive.service.web.forms import Posted, form_action, selection_of
from redrive.service.web.params import FILTER_FIELDS, local_url
from redrive.service.web.replay_forms import PreviewStep, carried
from redrive.service.web.representations import dead_letter_summary

SAMPLE_SIZE = 20


@form_action("/dead-letters/delete-preview")
def preview_delete(p: Posted) -> Response:
    back = local_url(p.field("back"), "/dead-letters")
    scope = "selected" if p.field("scope") == "selected" else "matching"
    try:
        body, what = selection_of(p, scope)
    except ValueError as exc:
        return p.redirect(back, "error", str(exc))
    if scope == "selected":
        letters = p.store.dead_letters_by_id(body["ids"])
        count = len(letters)
        by_topic = Counter(letter.topic or "" for letter in letters)
        sample = sorted(letters, key=lambda letter: -letter.id)[:SAMPLE_SIZE]
    else:
        flt: DeadLetterFilter = body["filter"]
        count = p.store.count_dead_letters(flt)
        sample = p.store.find_dead_letters(flt, limit=SAMPLE_SIZE)
        by_topic = Counter(p.store.dead_letter_topics(flt))
    # Where the delete lands: the page the preview came from, unless that page is of
    # the letters themselves (an error group's page has none left to show).
    after = local_url(p.field("after_delete"), back, "/")
    step = PreviewStep(
        "/dead-letters/bulk",
        [("op", f"delete:{scope}"), ("back", after), *carried(p, (*FILTER_FIELDS, "ids", "all"))],
    )
    return p.pages.render(
        p.request,
        "delete_preview.html",
        p.who,
        nav="dead-letters",
        what=f"Deleting {what}",
        count=count,
        topics=sorted(by_topic.items(), key=lambda item: (-item[1], item[0])),
        rows=[dead_letter_summary(letter) for letter in sample],
        back=back,
        step=step,
    )
