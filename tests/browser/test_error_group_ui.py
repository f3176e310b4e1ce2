"""An error group in the UI, in headless Chromium against the real service: the
list page filters by it (from its own form, and from a link), a group's replay is
previewed before it runs, and the job it starts names the group and nothing more.

What the pages send is what is checked: the requests the browser makes carry the
group, and the store says which letters were replayed and which were left.
"""

from __future__ import annotations

import uuid

import pytest
from playwright.sync_api import Page, Request, expect

from redrive.service.filters import DeadLetterFilter
from tests.browser.ui_harness import Ui, confirm, delivered, sign_in, stored_letter
from tests.integration.service_harness import Collector, now_ms

pytestmark = pytest.mark.browser


def _letters(ui: Ui, error_type: str, count: int, first_offset: int) -> str:
    """`count` letters of one failure on the orders topic; the id of their group."""
    letters = [
        stored_letter(
            ui,
            f"{error_type}-{n}".encode(),
            first_offset + n,
            error_type,
            f"row {uuid.uuid4()} was stale",
        )
        for n in range(count)
    ]
    ui.store.insert_batch([], letters, now_ms=now_ms())
    groups = {
        g.error_group for g in ui.store.error_groups(limit=500) if g.title.startswith(error_type)
    }
    assert len(groups) == 1, groups
    return groups.pop()


def _count(ui: Ui, **where: str) -> int:
    return ui.store.count_dead_letters(DeadLetterFilter(**where))


def test_the_list_filters_by_error_group_from_its_form_and_from_a_link(ui: Ui, page: Page) -> None:
    reads = _letters(ui, "console.StaleRead", 7, 70_000)
    _letters(ui, "console.StaleWrite", 5, 71_000)
    everything = _count(ui)
    assert everything > 7
    sign_in(page, ui.operator)

    page.goto(f"/dead-letters?error_group={reads}")
    expect(page.locator("h1 .count")).to_have_text("7 matching")
    expect(page.locator("table[data-rows] tbody tr")).to_have_count(7)
    expect(page.get_by_role("button", name="Replay all 7…")).to_be_visible()
    expect(page.get_by_role("button", name="Delete all 7…")).to_be_visible()
    expect(page.locator("[data-described]")).to_contain_text(f"error group '{reads}'")
    expect(page.locator("[data-described]")).to_contain_text("console.StaleRead")

    # The search form has the field, and what the browser sends carries it.
    page.goto("/dead-letters")
    expect(page.locator("h1 .count")).to_have_text(f"{everything:,}")
    page.get_by_label("Error group").fill(reads)
    with page.expect_request(lambda r: r.url.split("?")[0].endswith("/dead-letters")) as sent:
        page.get_by_role("button", name="Search").click()
    assert f"error_group={reads}" in sent.value.url
    expect(page.locator("table[data-rows] tbody tr")).to_have_count(7)

    # A bulk action on the filtered list posts the group with it.
    posted: list[Request] = []
    page.on("request", lambda r: posted.append(r) if r.method == "POST" else None)
    page.get_by_role("button", name="Replay all 7…").click()
    expect(page.locator("[data-preview-summary]")).to_contain_text("Would send 7 of 7")
    assert any(f"error_group={reads}" in (r.post_data or "") for r in posted)

    page.goto("/dead-letters?error_group=not-a-group")
    expect(page.locator(".flash-error")).to_contain_text("error group")
    expect(page.locator("table[data-rows]")).to_have_count(0)


def test_a_group_replay_is_previewed_then_runs_on_exactly_the_group(ui: Ui, page: Page) -> None:
    group = _letters(ui, "console.LostLock", 9, 72_000)
    other = _letters(ui, "console.LostLease", 4, 73_000)
    everything = _count(ui)
    sign_in(page, ui.operator)

    page.goto(f"/error-groups/{group}")
    page.get_by_role("button", name="Replay group…").click()
    expect(page.locator("[data-preview-summary]")).to_contain_text("Would send 9 of 9")
    expect(page.locator("#summary-title")).to_contain_text(f"error group '{group}'")
    expect(page.locator("[data-preview] table tbody tr")).to_have_count(1)
    expect(page.locator("[data-preview] table tbody tr")).to_contain_text(ui.orders)

    page.get_by_role("button", name="Replay these 9").click()
    confirm(page, "Replay these 9")
    expect(page.locator(".flash-ok")).to_contain_text("9 dead letters")
    expect(page.locator("[data-job-state]")).to_have_text("done", timeout=30_000)
    selection = page.locator("dd", has_text="error group")
    expect(selection).to_contain_text(f"error group '{group}'")
    search = page.get_by_role("link", name="Search them")
    assert search.get_attribute("href") == f"/dead-letters?error_group={group}"
    job_url = page.url

    assert _count(ui, error_group=group) == 0
    assert _count(ui, error_group=other) == 4
    assert _count(ui) == everything - 9, "the job replayed the group and nothing else"

    page.goto("/jobs")
    row = page.locator(f'tr[data-href="{job_url.split(ui.url)[-1]}"]')
    expect(row.locator(".selection-cell")).to_have_text(f"error group '{group}'")
    search.page.goto(job_url)
    page.get_by_role("link", name="Search them").click()
    expect(page.locator("h1 .count")).to_have_text("0 matching")


def test_a_group_replay_takes_its_settings_and_a_group_delete_is_previewed(
    ui: Ui, page: Page
) -> None:
    group = _letters(ui, "console.LostFence", 6, 74_000)
    other = _letters(ui, "console.LostToken", 3, 75_000)
    sign_in(page, ui.operator)
    posted: list[Request] = []
    page.on("request", lambda r: posted.append(r) if r.method == "POST" else None)

    page.goto(f"/error-groups/{group}")
    page.get_by_label("Rate (per second)").fill("3")
    page.get_by_label("Destination").fill(ui.payments)
    page.get_by_label("Keep the letters after replaying").check()
    page.get_by_role("button", name="Replay group…").click()
    title = page.locator("#summary-title")
    expect(title).to_contain_text(f"error group '{group}'")
    expect(title).to_contain_text(f"to {ui.payments} at 3/s, keeping them")
    expect(page.locator("[data-preview-summary]")).to_contain_text("Would send 6 of 6")
    expect(page.locator("[data-preview] table tbody tr")).to_have_text([f"{ui.payments}by key6"])
    asked = posted[-1].post_data or ""
    assert all(f in asked for f in (f"error_group={group}", "rate=3", "keep=1")), asked

    collector = Collector(ui.bootstrap, ui.payments)
    try:
        page.get_by_role("button", name="Replay these 6").click()
        confirm(page, "Replay these 6")
        expect(page.locator(".flash-ok")).to_contain_text("6 dead letters at 3/s")
        ran = posted[-1].post_data or ""
        assert all(f in ran for f in (f"error_group={group}", "rate=3", "keep=1")), ran
        expect(page.locator("[data-job-state]")).to_have_text("done", timeout=30_000)
        for n in range(6):
            delivered(collector, f"console.LostFence-{n}".encode())
    finally:
        collector.close()
    assert _count(ui, error_group=group) == 6, "kept, as the settings said"

    page.goto(f"/error-groups/{group}")
    page.get_by_role("button", name="Delete group…").click()
    expect(page.locator("#summary-title")).to_contain_text(f"error group '{group}'")
    expect(page.locator("[data-preview-summary]")).to_have_text(
        "Would delete 6 dead letters. This cannot be undone."
    )
    expect(page.locator("[data-delete-preview] table tbody tr")).to_have_text([f"{ui.orders}6"])
    assert _count(ui, error_group=group) == 6, "a preview deletes nothing"
    page.get_by_role("button", name="Delete these 6").click()
    confirm(page, "Delete these 6")
    expect(page.locator(".flash-ok")).to_have_text("Deleted 6 dead letters.")
    assert page.url.endswith("/error-groups")
    assert _count(ui, error_group=group) == 0
    assert _count(ui, error_group=other) == 3
