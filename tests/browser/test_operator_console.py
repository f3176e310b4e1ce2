"""The operator's home and records, in headless Chromium against the real service: the
overview shows the error groups that surge (and not those whose letters came back
from a replay) and leads to them; the audit page searches by who, what, which letter
and when, as the API does; screenshots of the console's pages for people to look at.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from redrive.service.filters import DeadLetterFilter
from redrive.service.group_metrics import SURGE_MIN_LETTERS
from tests.browser.ui_harness import Ui, confirm, sign_in, stored_letter
from tests.integration.service_harness import now_ms

pytestmark = pytest.mark.browser


def _flood(ui: Ui, error_type: str, count: int, first_offset: int, *, replayed: bool) -> None:
    """`count` letters of one failure stored now; `replayed`: each came back dead from
    a replay of an earlier letter."""
    letters = [
        stored_letter(ui, f"{error_type}-{n}".encode(), first_offset + n, error_type, "no lease")
        for n in range(count)
    ]
    if replayed:
        letters = [
            dataclasses.replace(d, replay_of=10**12 + n, replays=1) for n, d in enumerate(letters)
        ]
    ui.store.insert_batch([], letters, now_ms=now_ms())


def test_the_overview_shows_surging_groups_and_leads_to_them(ui: Ui, page: Page) -> None:
    _flood(ui, "console.Flood", SURGE_MIN_LETTERS + 5, 80_000, replayed=False)
    _flood(ui, "console.Echo", SURGE_MIN_LETTERS + 5, 81_000, replayed=True)
    sign_in(page, ui.viewer)
    page.goto("/")
    surging = page.locator("[data-surging] tbody tr")
    expect(surging.filter(has_text="console.Flood")).to_have_count(1)
    expect(surging.filter(has_text="console.Flood")).to_contain_text(f"{SURGE_MIN_LETTERS + 5}")
    expect(surging.filter(has_text="console.Echo")).to_have_count(0)
    surging.filter(has_text="console.Flood").get_by_role("link").click()
    expect(page.locator("h1")).to_have_text("console.Flood: no lease")
    page.goto("/")
    page.get_by_role("link", name="All error groups").click()
    expect(page.locator("h1")).to_contain_text("Error groups")


def test_the_audit_page_searches_by_who_what_which_letter_and_when(ui: Ui, page: Page) -> None:
    letter = stored_letter(ui, b"audited", 82_000, "console.Audited", f"row {uuid.uuid4()}")
    ui.store.insert_batch([], [letter], now_ms=now_ms())
    [stored] = ui.ops.dead_letters(DeadLetterFilter(error_type="console.Audited"), limit=5)[0]
    sign_in(page, ui.operator)
    page.goto(f"/dead-letters/{stored.id}")
    page.get_by_role("button", name="Delete", exact=True).click()
    confirm(page, "Delete")
    expect(page.locator(".flash-ok")).to_contain_text(f"Deleted dead letter {stored.id}")

    page.goto("/audit")
    expect(page.locator("[data-audit] tbody tr").first).to_be_visible()
    page.get_by_label("Dead letter").fill(str(stored.id))
    page.get_by_label("Who").fill("ui-operator")
    with page.expect_request(lambda r: "/audit?" in r.url) as sent:
        page.get_by_role("button", name="Search").click()
    assert f"letter={stored.id}" in sent.value.url and "actor=ui-operator" in sent.value.url
    rows = page.locator("[data-audit] tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.locator("[data-action]")).to_have_text("delete")
    expect(rows).to_contain_text(str(stored.id))
    api = ui.ops.audit_log(limit=10)[0]
    assert [e.action for e in api if stored.id in e.ids] == ["delete"]

    # Each field narrows: another action, another actor, a time range after it.
    page.goto(f"/audit?letter={stored.id}&action=replay")
    expect(page.get_by_text("No entry matches this search.")).to_be_visible()
    page.goto(f"/audit?letter={stored.id}&actor=someone-else")
    expect(page.get_by_text("No entry matches this search.")).to_be_visible()
    later = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    page.goto(f"/audit?letter={stored.id}&since={later}")
    expect(page.get_by_text("No entry matches this search.")).to_be_visible()
    page.goto("/audit?letter=not-a-number")
    expect(page.locator(".flash-error")).to_contain_text("letter")
    expect(page.get_by_label("Dead letter")).to_have_value("not-a-number")


def test_screenshots_of_the_operators_console(ui: Ui, page: Page, output_dir: Path) -> None:
    shots = output_dir / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    _flood(ui, "console.Storm", SURGE_MIN_LETTERS + 20, 83_000, replayed=False)
    sign_in(page, ui.operator)
    page.goto("/")
    expect(page.locator("[data-surging] tbody tr").filter(has_text="console.Storm")).to_have_count(
        1
    )
    page.screenshot(path=shots / "overview-surging.png", full_page=True)
    page.goto("/error-groups")
    page.screenshot(path=shots / "error-groups.png", full_page=True)
    page.goto("/")
    page.locator("[data-surging] tbody tr", has_text="console.Storm").get_by_role("link").click()
    expect(page.locator("h1")).to_have_text("console.Storm: no lease")
    page.get_by_label("Rate (per second)").fill("20")
    page.screenshot(path=shots / "error-group.png", full_page=True)
    page.get_by_role("button", name="Delete group…").click()
    expect(page.locator("[data-preview-summary]")).to_contain_text("Would delete")
    page.screenshot(path=shots / "delete-preview.png", full_page=True)
    page.go_back()
    page.get_by_role("button", name="Replay group…").click()
    expect(page.locator("[data-preview-summary]")).to_contain_text("Would send")
    page.screenshot(path=shots / "replay-preview.png", full_page=True)
    replay = page.get_by_role("button", name="Replay these")
    label = replay.inner_text()
    replay.click()
    confirm(page, label)
    expect(page.locator("[data-job-state]")).to_have_text("done", timeout=60_000)
    page.screenshot(path=shots / "job.png", full_page=True)
    page.goto("/audit")
    expect(page.locator("[data-audit] tbody tr").first).to_be_visible()
    page.screenshot(path=shots / "audit.png", full_page=True)
    names = ("overview-surging", "error-groups", "error-group", "delete-preview", "replay-preview")
    for name in (*names, "job", "audit"):
        assert (shots / f"{name}.png").stat().st_size > 10_000, name
