"""The web UI in headless Chromium, against the real service, broker and database
(the seeded service of ``conftest.py``: tests/browser/ui_harness.py says what it holds).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from redrive.deadlines import Deadline
from redrive.service.filters import DeadLetterFilter
from tests.browser.ui_harness import (
    XSS_MESSAGE,
    XSS_VALUE,
    Ui,
    audited,
    confirm,
    create_topics,
    dead_request,
    delivered,
    sign_in,
    stored_letter,
)
from tests.integration.service_harness import Collector, now_ms, produce, request_headers

pytestmark = pytest.mark.browser


def test_screenshots_of_every_page(ui: Ui, browser: Browser, page: Page, output_dir: Path) -> None:
    shots = output_dir / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)

    anonymous = browser.new_context(base_url=ui.url, viewport={"width": 1360, "height": 900})
    login = anonymous.new_page()
    login.goto("/login")
    expect(login.get_by_label("API token")).to_be_focused()
    login.screenshot(path=shots / "login.png")
    anonymous.close()

    sign_in(page, ui.operator)
    page.goto("/")
    expect(page.locator('[data-stat="dead"]')).not_to_have_text("0")
    expect(page.locator("figure.chart")).to_have_count(2)
    page.screenshot(path=shots / "overview.png", full_page=True)

    page.goto("/pending")
    expect(page.locator("table[data-rows] tbody tr")).to_have_count(4)
    page.screenshot(path=shots / "pending.png", full_page=True)

    page.goto("/dead-letters")
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("x")
    page.screenshot(path=shots / "dead-letters.png", full_page=True)
    page.keyboard.press("?")
    expect(page.locator("dialog#shortcuts")).to_be_visible()
    page.screenshot(path=shots / "shortcuts.png")
    page.keyboard.press("Escape")

    letter = ui.letter("billing.InvoiceRejected")
    page.goto(f"/dead-letters/{letter.id}")
    expect(page.locator("#value pre.code.json")).to_contain_text('"currency": "EUR"')
    page.screenshot(path=shots / "dead-letter.png", full_page=True)
    page.get_by_role("button", name="Delete", exact=True).click()
    expect(page.locator("dialog#confirm")).to_be_visible()
    page.screenshot(path=shots / "confirm-dialog.png")
    page.locator("dialog#confirm").get_by_role("button", name="Cancel").click()

    binary = ui.letter("codec.DecodeError")
    page.goto(f"/dead-letters/{binary.id}")
    expect(page.locator("#value pre.code.binary")).to_contain_text("00000000  00 01 02 03")
    page.screenshot(path=shots / "dead-letter-binary.png", full_page=True)
    for name in ("login", "overview", "pending", "dead-letters", "dead-letter"):
        assert (shots / f"{name}.png").stat().st_size > 10_000


def test_search_open_and_replay(ui: Ui, page: Page) -> None:
    letter = ui.letter("shop.PaymentDeclined")
    collector = Collector(ui.bootstrap, ui.orders)
    try:
        sign_in(page, ui.operator)
        page.goto("/")
        total = ui.store.totals()["dead_letters"]["total"]
        expect(page.locator('[data-stat="dead"]')).to_have_text(f"{total:,}")
        expect(page.locator("table.breakdown").filter(has_text="Error type")).to_contain_text(
            "shop.PaymentDeclined"
        )

        page.keyboard.press("g")
        page.keyboard.press("d")
        page.wait_for_url("**/dead-letters")
        page.keyboard.press("/")
        expect(page.locator("input[name=text]")).to_be_focused()
        page.keyboard.press("Escape")
        page.locator("input[name=error_type]").fill("shop.PaymentDeclined")
        page.locator("input[name=error_type]").press("Enter")
        rows = page.locator("table[data-rows] tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text("card declined by issuer")

        page.keyboard.press("j")
        expect(rows.first).to_have_class(re.compile("selected"))
        page.keyboard.press("Enter")
        page.wait_for_url(re.compile(rf"/dead-letters/{letter.id}\?back="))
        expect(page.locator("pre.code.key")).to_have_text("order-7")
        expect(page.locator("#value pre.code.json")).to_contain_text('"sku": "A-1"')
        expect(page.locator("table.headers").first).to_contain_text("trace-7")
        expect(page.locator("pre.trace")).to_contain_text("raise PaymentDeclined")
        expect(page.locator("dl.facts")).to_contain_text(f"{ui.orders} / p0 @ ")

        page.get_by_role("button", name="Replay", exact=True).click()
        expect(page.locator("#confirm-text")).to_have_text(
            f"Replay dead letter {letter.id} to {ui.orders}?"
        )
        confirm(page, "Replay")
        expect(page.locator(".flash-ok")).to_contain_text(f"Replayed dead letter {letter.id}")
        # Back on the search it came from, which no longer finds it.
        expect(page).to_have_url(re.compile(r"/dead-letters\?error_type=shop.PaymentDeclined$"))
        expect(page.locator("table[data-rows]")).to_have_count(0)

        got = delivered(collector, b"order-7")
        assert got.value == letter.msg_value
        assert got.headers == [
            ("trace-id", b"trace-7"),
            ("tenant", b"acme"),
            ("redrive-replays", b"1"),
            ("redrive-replay-of", str(letter.id).encode()),
        ]
    finally:
        collector.close()
    assert ui.store.dead_letter_by_id(letter.id) is None
    entry = audited(ui, "replay", letter.id)
    assert entry.actor == "ui-operator"
    assert entry.role == "operator"


def test_edit_then_replay_and_refused_destination(ui: Ui, page: Page) -> None:
    letter = ui.letter("shop.PriceMismatch")
    collector = Collector(ui.bootstrap, ui.orders)
    try:
        sign_in(page, ui.operator)
        page.goto(f"/dead-letters/{letter.id}")
        page.get_by_text("Edit the value, then replay").click()
        textarea = page.locator("textarea[name=value]")
        expect(textarea).to_have_value('{"order": 8, "price": 10}')

        # A destination outside the allowlist: the API's refusal, shown on the page.
        edit = page.locator("details.edit")
        edit.locator("input[name=destination]").fill("__consumer_offsets")
        edit.get_by_role("button", name="Replay edited value").click()
        confirm(page, "Replay edited value")
        expect(page.locator(".flash-error")).to_contain_text("not allowed")
        assert ui.store.dead_letter_by_id(letter.id) is not None

        page.get_by_text("Edit the value, then replay").click()
        page.locator("textarea[name=value]").fill('{"order": 8,\n "price": 12}')
        page.get_by_role("button", name="Replay edited value").click()
        confirm(page, "Replay edited value")
        expect(page.locator(".flash-ok")).to_contain_text(f"Replayed dead letter {letter.id}")
        got = delivered(collector, b"order-8")
        assert got.value == b'{"order": 8,\n "price": 12}'
        assert got.headers == [
            ("trace-id", b"t-order-8"),
            ("redrive-replays", b"1"),
            ("redrive-replay-of", str(letter.id).encode()),
        ]
    finally:
        collector.close()
    assert audited(ui, "edit-and-replay", letter.id).actor == "ui-operator"


def test_delete_one_and_bulk(ui: Ui, page: Page) -> None:
    letter = ui.letter("shop.OutOfStock")
    sign_in(page, ui.operator)
    page.goto("/dead-letters?error_type=shop.OutOfStock")
    page.get_by_role("link", name=str(letter.id), exact=True).click()
    page.get_by_role("button", name="Delete", exact=True).click()
    expect(page.locator("#confirm-text")).to_have_text(
        f"Delete dead letter {letter.id}? This cannot be undone."
    )
    confirm(page, "Delete")
    expect(page.locator(".flash-ok")).to_have_text(f"Deleted dead letter {letter.id}.")
    expect(page.get_by_text("No dead letter matches this search.")).to_be_visible()
    assert ui.store.dead_letter_by_id(letter.id) is None
    entry = audited(ui, "delete", letter.id)
    assert (entry.actor, entry.count) == ("ui-operator", 1)

    # Bulk: tick two rows with the keyboard, delete them, then replay what the filter matches.
    page.goto("/dead-letters?error_type=shop.Timeout")
    rows = page.locator("table[data-rows] tbody tr")
    expect(rows).to_have_count(3)
    ids = [int(i) for i in rows.evaluate_all("rs => rs.map(r => r.dataset.id)")]
    for key in ("j", "x", "j", "x"):
        page.keyboard.press(key)
    expect(page.locator("[data-selection-count]")).to_have_text("2 selected")
    page.get_by_role("button", name="Delete selected…").click()
    # A bulk action opens its preview first: what it would take, then the action.
    expect(page.locator("#summary-title")).to_have_text("Deleting the 2 selected dead letters")
    expect(page.locator("[data-preview-summary]")).to_have_text(
        "Would delete 2 dead letters. This cannot be undone."
    )
    shown = page.locator("[data-delete-preview] ~ section tbody tr")
    assert sorted(int(i) for i in shown.locator("td a").all_inner_texts()) == sorted(ids[:2])
    page.get_by_role("button", name="Delete these 2").click()
    expect(page.locator("#confirm-text")).to_have_text(
        "Delete the 2 dead letters as previewed? This cannot be undone."
    )
    confirm(page, "Delete these 2")
    expect(page.locator(".flash-ok")).to_have_text("Deleted 2 dead letters.")
    expect(rows).to_have_count(1)
    assert audited(ui, "delete", ids[0]).ids == sorted(ids[:2])

    remaining = ui.store.dead_letter_by_id(ids[2])
    assert remaining is not None
    collector = Collector(ui.bootstrap, ui.orders)
    try:
        page.get_by_role("button", name="Replay all 1…").click()
        expect(page.locator("#summary-title")).to_contain_text("error type 'shop.Timeout'")
        expect(page.locator("[data-preview-summary]")).to_contain_text("Would send 1 of 1")
        page.get_by_role("button", name="Replay it").click()
        expect(page.locator("#confirm-text")).to_contain_text("as previewed")
        confirm(page, "Replay it")
        # A bulk replay is a job: its page follows it until it is done.
        page.wait_for_url(re.compile(r"/jobs/\d+$"))
        job_id = int(page.url.rsplit("/", 1)[1])
        expect(page.locator(".flash-ok")).to_have_text(
            f"Replay job {job_id} started: 1 dead letter at 500/s."
        )
        page.evaluate("window.__samePage = true")  # gone if the page reloads
        expect(page.locator("[data-job-state]")).to_have_text("done", timeout=30_000)
        expect(page.locator("[data-job-summary]")).to_have_text("1 of 1 · sent 1 · failed 0")
        expect(page.get_by_role("progressbar", name="Progress")).to_have_attribute("value", "1")
        assert page.evaluate("window.__samePage") is True
        delivered(collector, remaining.msg_key)
    finally:
        collector.close()
    assert ui.store.dead_letter_by_id(ids[2]) is None
    started = audited(ui, "replay-job", ids[2])
    assert started.filter == {"error_type": "shop.Timeout"}
    assert started.detail["job"] == job_id
    entry = audited(ui, "replay", ids[2])
    assert (entry.actor, entry.ids) == ("ui-operator", [ids[2]])
    assert entry.detail["job"] == job_id


def test_replay_job_progress_and_cancel(
    ui: Ui, browser: Browser, page: Page, output_dir: Path
) -> None:
    (topic,) = create_topics(ui.bootstrap, "slow")
    flt = DeadLetterFilter(error_type="slow.Job")
    letters = [
        dead_request(topic, "slow.Job", f"slow-{i}".encode(), b'{"slow": true}', offset=2000 + i)
        for i in range(40)
    ]
    produce(ui.bootstrap, ui.service.settings.requests_topic, letters)
    deadline = Deadline(30)
    while ui.store.count_dead_letters(flt) < 40 and not deadline.passed():
        time.sleep(0.1)
    assert ui.store.count_dead_letters(flt) == 40

    sign_in(page, ui.operator)
    # At 1 a second (the least a job takes), 40 letters take 40 s: time to watch it and
    # cancel it on a loaded machine, whose browser steps took over 10 s. (The UI's bulk
    # replay uses the service's rate; the API takes one.)
    answer = page.request.post(
        "/api/v1/dead-letters/replay",
        headers={"Authorization": f"Bearer {ui.operator}"},
        data={"filter": {"error_type": "slow.Job"}, "rate": 1},
    )
    assert answer.status == 202, answer.text()
    job_id = answer.json()["job"]["id"]

    page.goto(f"/jobs/{job_id}")
    expect(page.locator("[data-job-state]")).to_have_text("running")
    bar = page.get_by_role("progressbar", name="Progress")
    page.evaluate("window.__samePage = true")  # gone if the page reloads
    first = float(bar.evaluate("b => b.value"))
    page.wait_for_function(
        "v => document.querySelector('[data-job-bar]').value > v", arg=first, timeout=30_000
    )
    expect(page.locator("[data-job-summary]")).to_contain_text(re.compile(r" of 40 · sent \d+"))
    assert page.evaluate("window.__samePage") is True
    assert 0 < float(bar.evaluate("b => b.value")) < 40
    shots = output_dir / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=shots / "job-progress.png", full_page=True)

    # A viewer follows the same job in another window: no Cancel button for them.
    viewer = browser.new_context(base_url=ui.url, viewport={"width": 1360, "height": 900})
    try:
        watcher = viewer.new_page()
        sign_in(watcher, ui.viewer)
        watcher.goto(f"/jobs/{job_id}")
        expect(watcher.locator("[data-job-state]")).to_have_text("running")
        expect(watcher.get_by_role("button", name="Cancel job…")).to_have_count(0)
        expect(watcher.locator(".job-actions .notice")).to_contain_text("needs an operator")
        watcher.evaluate("window.__samePage = true")
        _cancel_job(page, job_id)
        # The viewer's page sees the end without reloading.
        expect(watcher.locator("[data-job-state]")).to_have_text("cancelled")
        expect(watcher.locator("[data-job-finished] time")).to_be_visible()
        expect(watcher.locator("dl.facts")).to_contain_text("Cancelled by")
        expect(watcher.locator(".job-actions")).to_be_hidden()
        expect(watcher.locator("[data-job-summary]")).to_contain_text("cancelled")
        assert watcher.evaluate("window.__samePage") is True
    finally:
        viewer.close()

    # What it did not send stays: every letter is sent or cancelled (a batch being sent
    # when the cancel came is recorded just after).
    deadline = Deadline(10)
    while True:
        job = ui.store.replay_jobs.get(job_id, with_failures=True)
        assert job is not None
        if job.sent + job.cancelled == 40 or deadline.passed():
            break
        time.sleep(0.1)
    assert (job.state, job.sent + job.cancelled) == ("cancelled", 40)
    assert 0 < job.sent < 40
    assert ui.store.count_dead_letters(flt) == job.cancelled
    left = ui.store.dead_letter_ids(flt, limit=1)[0]
    assert audited(ui, "replay-job", left).detail["job"] == job_id
    entries, _ = ui.ops.audit_log(limit=20)
    [cancel] = [e for e in entries if e.action == "cancel-replay-job"]
    assert (cancel.actor, cancel.detail["job"]) == ("ui-operator", job_id)

    # The list shows it; g j goes there from any page.
    page.keyboard.press("g")
    page.keyboard.press("j")
    page.wait_for_url("**/jobs")
    row = page.locator(f'tr[data-id="{job_id}"]')
    expect(row).to_contain_text("cancelled")
    expect(row).to_contain_text("error type 'slow.Job'")
    page.screenshot(path=shots / "jobs.png", full_page=True)
    row.click()
    page.wait_for_url(f"**/jobs/{job_id}")

    # What the page polls; ids no job can have, and a cursor the list did not give.
    assert page.request.get(f"/jobs/{job_id}.json").json()["state"] == "cancelled"
    for path in ("/jobs/999999999", f"/jobs/{2**64}", f"/jobs/{2**64}.json"):
        assert page.request.get(path).status == 404, path
    bad_cursor = page.request.get("/jobs?cursor=%00not-a-cursor")
    assert bad_cursor.status == 200 and "is not one this API returned" in bad_cursor.text()
    missing = page.goto("/jobs/999999999")
    assert missing is not None and missing.status == 404
    expect(page.get_by_role("heading", name="Not found")).to_be_visible()


def _cancel_job(page: Page, job_id: int) -> None:
    """Cancel the job through its page's button, which lands on the page again."""
    page.get_by_role("button", name="Cancel job…").click()
    expect(page.locator("#confirm-text")).to_have_text(
        f"Cancel replay job {job_id}? The dead letters it has not sent yet stay dead letters."
    )
    confirm(page, "Cancel job")
    expect(page.locator(".flash-ok")).to_contain_text(f"Replay job {job_id} cancelled:")
    expect(page.locator("[data-job-state]")).to_have_text("cancelled")
    expect(page.locator("dl.facts")).to_contain_text("Cancelled by")
    expect(page.locator("dl.facts")).to_contain_text("ui-operator")
    expect(page.get_by_role("button", name="Cancel job…")).to_have_count(0)


def test_payloads_are_shown_as_text(ui: Ui, page: Page) -> None:
    letter = ui.letter("xss.Probe")
    page.goto("/dead-letters?error_type=xss.Probe")
    expect(page.locator(".error-msg")).to_have_text(XSS_MESSAGE)
    expect(page.locator("td.key-cell")).to_have_text("<b>key</b>")
    page.get_by_role("link", name=str(letter.id), exact=True).click()

    expect(page.locator("#value pre.code")).to_have_text(XSS_VALUE)
    expect(page.locator("#value pre.code")).to_be_visible()
    expect(page.locator(".error-message")).to_have_text(XSS_MESSAGE)
    expect(page.locator("table.headers").first).to_contain_text("<script>window.__xss = 3</script>")
    expect(page.locator("textarea[name=value]")).to_have_value(XSS_VALUE)
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.locator("script:not([src])").count() == 0
    assert page.locator("main img").count() == 0


def test_forms_need_csrf_token_and_operator(ui: Ui, browser: Browser, page: Page) -> None:
    letter = ui.letter("shop.Fraud")
    sign_in(page, ui.operator)

    # No CSRF field, then a forged one: refused even though the session is an operator's.
    url = f"/dead-letters/{letter.id}/delete"
    refused = page.request.post(url, form={"confirmed": "1"}, max_redirects=0)
    assert refused.status == 403
    assert "CSRF" in refused.text()
    forged = page.request.post(url, form={"confirmed": "1", "csrf": "A" * 43}, max_redirects=0)
    assert forged.status == 403

    # A page on another site that posts the form: the browser sends no cookie, refused.
    evil = (
        f'<form method="post" action="{ui.url}{url}"><input name="confirmed" value="1">'
        f'<input name="csrf" value="{"B" * 43}"></form><script>document.forms[0].submit()</script>'
    )
    page.route("http://evil.test/", lambda r: r.fulfill(body=evil, content_type="text/html"))
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        page.goto("http://evil.test/")
    assert posted.value.status == 403
    assert ui.store.dead_letter_by_id(letter.id) is not None

    # Signed in as a viewer: the page says so, and the action is refused with that message.
    viewer = browser.new_context(base_url=ui.url)
    try:
        vpage = viewer.new_page()
        sign_in(vpage, ui.viewer)
        expect(vpage.locator(".who")).to_contain_text("ui-viewer viewer")
        vpage.goto(f"/dead-letters/{letter.id}")
        expect(vpage.locator(".actions .notice")).to_contain_text("sign in with an operator token")
        vpage.get_by_role("button", name="Delete", exact=True).click()
        with vpage.expect_response(lambda r: r.request.method == "POST") as answer:
            confirm(vpage, "Delete")
        assert answer.value.status == 403
        expect(vpage.get_by_role("heading", name="Operator token needed")).to_be_visible()
        expect(vpage.locator(".lead")).to_have_text(
            "This action needs an operator token: sign in with an operator token."
        )
        vpage.get_by_role("link", name="Sign in with an operator token").click()
        expect(vpage).to_have_url(re.compile(r"/login\?next="))
    finally:
        viewer.close()
    assert ui.store.dead_letter_by_id(letter.id) is not None
    entries, _ = ui.ops.audit_log(limit=100)
    assert not [e for e in entries if letter.id in e.ids]


def test_forms_work_without_javascript(ui: Ui, browser: Browser) -> None:
    letter = ui.letter("shop.NoScript")
    ctx = browser.new_context(base_url=ui.url, java_script_enabled=False)
    try:
        page = ctx.new_page()
        sign_in(page, ui.operator)
        page.goto(f"/dead-letters/{letter.id}")
        page.get_by_role("button", name="Delete", exact=True).click()
        expect(page.get_by_role("heading", name="Please confirm")).to_be_visible()
        expect(page.locator(".lead")).to_have_text(
            f"Delete dead letter {letter.id}? This cannot be undone."
        )
        page.get_by_role("button", name="Delete", exact=True).click()
        expect(page.locator(".flash-ok")).to_have_text(f"Deleted dead letter {letter.id}.")
    finally:
        ctx.close()
    assert ui.store.dead_letter_by_id(letter.id) is None


def test_pending_retry_now_and_cancel(ui: Ui, page: Page) -> None:
    first, second = ui.pending_ids[b"pay-1"], ui.pending_ids[b"pay-2"]
    collector = Collector(ui.bootstrap, ui.payments)
    try:
        sign_in(page, ui.operator)
        page.goto("/pending")
        row = page.locator(f'tr[data-id="{first}"]')
        # Due 10 minutes after the module's set-up: how much of that is left depends
        # on how loaded the machine was since, not on the page.
        expect(row.locator("td.due time")).to_have_text(re.compile(r"^in ([1-9]|10)m"))
        expect(row).to_contain_text(ui.payments)
        row.get_by_role("button", name="Retry now").click()
        expect(page.locator(".flash-ok")).to_have_text(f"Pending retry {first} is due now.")
        got = delivered(collector, b"pay-1")
        assert got.value == b'{"payment": 1}'
        deadline = Deadline(10)
        while ui.store.pending_by_id(first) is not None and not deadline.passed():
            time.sleep(0.05)
        page.reload()
        expect(page.locator(f'tr[data-id="{first}"]')).to_have_count(0)

        page.locator(f'tr[data-id="{second}"]').get_by_role("button", name="Cancel…").click()
        confirm(page, "Cancel retry")
        expect(page.locator(".flash-ok")).to_contain_text(f"Pending retry {second} cancelled")
        expect(page.locator(f'tr[data-id="{second}"]')).to_have_count(0)
    finally:
        collector.close()
    assert ui.store.pending_by_id(second) is None
    cancelled, _ = ui.ops.dead_letters(DeadLetterFilter(reason="cancelled"), limit=10)
    assert [r.msg_key for r in cancelled] == [b"pay-2"]
    assert audited(ui, "retry-now", first).actor == "ui-operator"
    assert audited(ui, "cancel", second).actor == "ui-operator"


def test_cookies_headers_and_reads_behind_a_token(
    ui: Ui, context: BrowserContext, page: Page
) -> None:
    response = page.goto("/login")
    assert response is not None
    headers = response.headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["cache-control"] == "no-store"
    sign_in(page, ui.viewer)
    cookies = {c["name"]: c for c in context.cookies()}
    for name in ("redrive_session", "redrive_csrf"):
        assert cookies[name]["httpOnly"], name
        assert cookies[name]["sameSite"] == "Strict", name
    assert cookies["redrive_session"]["value"] == ui.viewer

    # With require_token_for_reads, an anonymous reader is sent to sign in, then back.
    ui.service.settings.require_token_for_reads = True
    try:
        anonymous = page.context.browser.new_context(base_url=ui.url)  # type: ignore[union-attr]
        try:
            apage = anonymous.new_page()
            apage.goto("/dead-letters?error_type=shop.Fraud")
            expect(apage).to_have_url(re.compile(r"/login\?next="))
            expect(apage.locator(".login")).to_contain_text("needs a token to read")
            apage.get_by_label("API token").fill("rdv_not-a-real-token")
            apage.get_by_role("button", name="Sign in").click()
            expect(apage.locator(".flash-error")).to_contain_text("Unknown or revoked token")
            apage.get_by_label("API token").fill(ui.viewer)
            apage.get_by_role("button", name="Sign in").click()
            expect(apage).to_have_url(re.compile(r"/dead-letters\?error_type=shop.Fraud$"))
            expect(apage.locator("table[data-rows] tbody tr")).to_have_count(1)
            apage.get_by_role("button", name="Sign out").click()
            apage.goto("/")
            expect(apage).to_have_url(re.compile(r"/login\?next=%2F$"))
        finally:
            anonymous.close()
    finally:
        ui.service.settings.require_token_for_reads = False


def test_cursor_pagination(ui: Ui, page: Page, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("redrive.service.web.pages.PAGE_SIZE", 3)
    page.goto("/dead-letters?group=inventory-sync")
    rows = page.locator("table[data-rows] tbody tr")
    expect(rows).to_have_count(3)
    first = rows.evaluate_all("rs => rs.map(r => Number(r.dataset.id))")
    page.get_by_role("link", name="Older").click()
    expect(page).to_have_url(re.compile(r"group=inventory-sync&cursor="))
    expect(rows).to_have_count(2)
    second = rows.evaluate_all("rs => rs.map(r => Number(r.dataset.id))")
    assert max(second) < min(first)
    expect(page.get_by_role("link", name="Older")).to_have_count(0)
    page.get_by_role("link", name="First page").click()
    expect(rows).to_have_count(3)

    monkeypatch.setattr("redrive.service.web.pages.PAGE_SIZE", 1)  # at least 2 stay pending
    page.goto("/pending")
    expect(page.locator("table[data-rows] tbody tr")).to_have_count(1)
    expect(page.get_by_role("link", name="Later")).to_be_visible()


# ---------------------------------------------------------------------- a record's story


def _failure(
    topic: str, key: bytes, offset: int, attempt: int, message: str, delay_ms: int = 300, **kw: Any
) -> dict[str, Any]:
    """A consumer's request after its `attempt`-th try of the record at `offset` failed."""
    fields = {
        "group": "checkout",
        "attempt": attempt,
        "original_topic": topic,
        "original_partition": 0,
        "original_offset": offset,
        "error_type": kw.pop("error_type", "orders.Timeout"),
        "error_message": message,
        **kw,
    }
    return {
        "key": key,
        "value": json.dumps({"order": offset}).encode(),
        "headers": request_headers(topic, now_ms() + delay_ms, [("trace-id", key)], **fields),
    }


def _deliveries(collector: Collector, key: bytes, count: int, timeout_s: float = 20) -> None:
    """Wait until `count` messages with `key` arrived on the collector's topic."""
    deadline = Deadline(timeout_s)
    while not deadline.passed():
        if sum(1 for d in collector.received if d.key == key) >= count:
            return
        collector.poll_until(len(collector.received) + 1, 0.5)
    raise AssertionError(f"{count} deliveries of {key!r} did not arrive on {collector.topic}")


def _story(ui: Ui, state: str, timeout_s: float = 20, **where: Any) -> dict[str, Any]:
    """The one story found by `where` once it reached `state` (the service settles a
    delivery in its store just after the broker acknowledged it)."""
    deadline = Deadline(timeout_s)
    while True:
        found = ui.ops.find_records(**where)
        if len(found) == 1 and found[0]["state"] == state:
            return found[0]
        if deadline.passed():
            raise AssertionError(f"no {state} story for {where}: {found}")
        time.sleep(0.1)


def test_record_story(ui: Ui, page: Page, output_dir: Path) -> None:
    (topic,) = create_topics(ui.bootstrap, "story")
    requests = ui.service.settings.requests_topic
    key = b"story-77"
    collector = Collector(ui.bootstrap, topic)
    try:
        # The record fails twice; each retry is delivered; the second retry succeeds
        # (the consumer says nothing more).
        first = _failure(topic, key, 77, 1, "gateway timed out", delay_ms=1500)
        produce(ui.bootstrap, requests, [first])
        _deliveries(collector, key, 1)
        again = _failure(topic, key, 77, 2, "gateway timed out again", delay_ms=1500)
        produce(ui.bootstrap, requests, [again])
        _deliveries(collector, key, 2)
    finally:
        collector.close()
    story = _story(ui, "delivered", key=key)
    assert story["attempts"] == 3
    assert [e["event"] for e in story["events"]] == [
        "failed",
        "scheduled",
        "delivered",
        "failed",
        "scheduled",
        "delivered",
    ]

    # Found by its key, through the form.
    page.goto("/")
    page.keyboard.press("g")
    page.keyboard.press("r")
    page.wait_for_url("**/records")
    expect(page.get_by_role("heading", name="Find a record")).to_be_visible()
    page.keyboard.press("/")
    expect(page.locator("input[name=key]")).to_be_focused()
    page.keyboard.type("story-77")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/records\?key=story-77$"))
    stories = page.locator("article.story")
    expect(stories).to_have_count(1)
    head = stories.locator(".story-head")
    expect(head.get_by_role("heading")).to_have_text(f"{topic} / p0 @ 77")
    expect(head.locator(".badge")).to_have_text("delivered")
    expect(head).to_contain_text("3 attempts")
    expect(stories.locator("dl.story-facts")).to_contain_text("checkout")
    events = stories.locator("ol.timeline > li")
    expect(events).to_have_count(6)
    failures = stories.locator("li.event-failed")
    expect(failures).to_have_count(2)
    expect(failures.nth(0)).to_contain_text("Attempt 1 failed — orders.Timeout: gateway timed out")
    expect(failures.nth(1)).to_contain_text(
        "Attempt 2 failed — orders.Timeout: gateway timed out again"
    )
    # Due 1.5 s after the request was made: a little less after the service had it.
    expect(events.nth(1)).to_contain_text(
        re.compile(r"Retry scheduled for attempt 2, (\d+ ms later|1(\.\d)? s later|at once) \(due")
    )
    expect(events.nth(1).locator("time")).to_have_text(re.compile(r"^\d\d:\d\d:\d\d\.\d{3}$"))
    expect(events.nth(2)).to_contain_text(f"Attempt 2 delivered to {topic}")
    expect(events.nth(5)).to_contain_text(f"Attempt 3 delivered to {topic}")
    expect(events.nth(5).locator("time")).to_have_attribute("datetime", re.compile(r"^\d{4}-"))
    shots = output_dir / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=shots / "record-story.png", full_page=True)

    # Found by where it was first consumed: the same story.
    page.get_by_role("link", name="Clear").click()
    page.wait_for_url(re.compile(r"/records$"))
    page.locator("input[name=topic]").fill(topic)
    page.locator("input[name=partition]").fill("0")
    page.locator("input[name=offset]").fill("77")
    page.get_by_role("button", name="Find").click()
    page.wait_for_url(re.compile(rf"/records\?topic={topic}&partition=0&offset=77$"))
    expect(stories).to_have_count(1)
    expect(stories.locator(".story-head")).to_contain_text("3 attempts")
    expect(stories.locator("li.event-delivered")).to_have_count(2)
    stories.get_by_role("link", name="all records with this key").click()
    page.wait_for_url(re.compile(r"/records\?key=story-77$"))
    expect(stories).to_have_count(1)

    # Nothing found, and searches the service refuses: said on the page.
    page.goto("/records?key=no-such-record")
    expect(page.locator(".empty")).to_contain_text("No record found")
    for search, problem in (
        ("partition=0", "give a key (key or key_base64) or an original topic"),
        ("key=a&offset=7", "partition and offset need the topic"),
        (f"topic={topic}&offset=seventy", "offset: Input should be a valid integer"),
        ("key=a&key_base64=YQ==", "give key or key_base64, not both"),
        ("key_base64=not*base64", re.compile(r"key_base64\W.*not base64")),
        (f"topic={topic}&offset={2**63}", "offset: Input should be less than or equal to"),
    ):
        response = page.goto(f"/records?{search}")
        assert response is not None and response.status == 200, search
        expect(page.locator(".flash-error")).to_contain_text(problem)
        expect(stories).to_have_count(0)


def test_record_story_of_a_dead_letter_and_a_pending_retry(ui: Ui, page: Page) -> None:
    (topic,) = create_topics(ui.bootstrap, "story")
    requests = ui.service.settings.requests_topic
    key = b"story-78"
    collector = Collector(ui.bootstrap, topic)
    try:
        produce(ui.bootstrap, requests, [_failure(topic, key, 78, 1, "gateway timed out")])
        _deliveries(collector, key, 1)
        _story(ui, "delivered", key=key)
        # The retry failed for good: the consumer gives up, a dead letter.
        gave_up = _failure(
            topic,
            key,
            78,
            2,
            "card declined by issuer",
            error_type="story.Fatal",
            send_to="dlq",
            reason="non-retryable error: story.Fatal",
        )
        produce(ui.bootstrap, requests, [gave_up])
        _story(ui, "dead", key=key)

        letter = ui.letter("story.Fatal")
        page.goto(f"/dead-letters/{letter.id}")
        page.get_by_role("link", name="Story of this record").click()
        page.wait_for_url(re.compile(rf"/records\?topic={topic}&partition=0&offset=78$"))
        story = page.locator("article.story")
        expect(story).to_have_count(1)
        expect(story.locator(".story-head .badge")).to_have_text("dead letter")
        expect(story.locator(".story-head")).to_contain_text("2 attempts")
        last = story.locator("ol.timeline > li").last
        expect(last).to_have_class(re.compile("event-dead_letter"))
        expect(last).to_contain_text("non-retryable error: story.Fatal")
        expect(story.locator("li.event-failed").last).to_contain_text(
            "Attempt 2 failed — story.Fatal: card declined by issuer"
        )
        last.get_by_role("link", name=f"Dead letter #{letter.id}").click()
        page.wait_for_url(f"**/dead-letters/{letter.id}")

        # A retry still waiting: its story links to it in the pending list, and back.
        produce(
            ui.bootstrap,
            requests,
            [_failure(topic, b"story-79", 79, 1, "gateway timed out", delay_ms=3_600_000)],
        )
        _story(ui, "pending", key=b"story-79")
        page.goto(f"/records?topic={topic}&offset=79")
        story = page.locator("article.story")
        expect(story.locator(".story-head .badge")).to_have_text("pending")
        expect(story.locator(".story-head")).to_contain_text("1 attempt")
        waiting = story.locator("li.event-scheduled.waiting")
        expect(waiting).to_contain_text(re.compile(r"Waiting: due in (59m|1h)"))
        pending_link = waiting.get_by_role("link", name=re.compile(r"pending retry #\d+"))
        pending_id = int((pending_link.text_content() or "").rsplit("#", 1)[1])
        pending_link.click()
        page.wait_for_url(re.compile(rf"/pending\?.*#pending-{pending_id}$"))
        row = page.locator(f'tr[data-id="{pending_id}"]')
        expect(row).to_be_visible()
        expect(row).to_contain_text(f"{topic} / p0 @ 79")
        row.get_by_role("link", name=f"Story of the record of pending retry {pending_id}").click()
        page.wait_for_url(re.compile(rf"/records\?topic={topic}&partition=0&offset=79$"))
        expect(page.locator("article.story .story-head .badge")).to_have_text("pending")

        # Deliver it, so that the pending list is as the other tests expect.
        assert ui.ops.retry_now(pending_id, now_ms())
        _deliveries(collector, b"story-79", 1)
        _story(ui, "delivered", key=b"story-79")
    finally:
        collector.close()


def _grouped_letters(ui: Ui) -> None:
    """30 letters of two failures whose messages differ in ids and numbers."""
    letters = [
        stored_letter(
            ui,
            f"g-{n}".encode(),
            50_000 + n,
            "groups.GatewayTimeout" if n % 3 else "groups.CardDeclined",
            f"gateway {uuid.uuid4()} timed out after {n * 11} ms"
            if n % 3
            else f"card of customer {n} declined (order order-{n})",
        )
        for n in range(30)
    ]
    ui.store.insert_batch([], letters, now_ms=now_ms())


def test_error_groups_pages(ui: Ui, page: Page, output_dir: Path) -> None:
    shots = output_dir / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    _grouped_letters(ui)
    sign_in(page, ui.operator)
    page.goto("/error-groups")
    timeout_row = page.locator("table.error-groups tbody tr", has_text="groups.GatewayTimeout")
    expect(timeout_row).to_have_count(1)
    expect(timeout_row).to_contain_text("gateway <uuid> timed out after <n> ms")
    expect(timeout_row.locator("td.num")).to_have_text("20")
    declined = page.locator("table.error-groups tbody tr", has_text="groups.CardDeclined")
    expect(declined.locator("td.num")).to_have_text("10")
    expect(timeout_row.locator("svg.sparkline rect")).to_have_count(24)
    page.screenshot(path=shots / "error-groups.png", full_page=True)

    timeout_row.get_by_role("link").click()
    expect(page.locator("h1")).to_contain_text("groups.GatewayTimeout")
    expect(page.locator("table[data-rows] tbody tr")).to_have_count(20)
    page.screenshot(path=shots / "error-group.png", full_page=True)
    page.get_by_role("button", name="Mute").click()
    expect(page.locator(".flash")).to_contain_text("muted")
    expect(page.locator(".page-head .badge")).to_have_text("muted")
    group = page.url.rsplit("/", 1)[-1]

    # A letter's page links to its group, and moves it to another.
    page.locator("table[data-rows] tbody tr a").first.click()
    expect(page.locator(f'a[href="/error-groups/{group}"]')).to_have_count(1)
    other = ui.store.error_groups(topic=ui.orders, limit=500)
    declined_group = next(g.error_group for g in other if g.title.startswith("groups.Card"))
    page.get_by_label("Move to error group").fill(declined_group)
    page.get_by_role("button", name="Move", exact=True).click()
    expect(page.locator(".flash")).to_contain_text(f"moved to error group {declined_group}")
    expect(page.locator(f'a[href="/error-groups/{declined_group}"]')).to_have_count(1)
    for name in ("error-groups", "error-group"):
        assert (shots / f"{name}.png").stat().st_size > 10_000


def test_a_quarantined_letter_is_flagged_previewed_and_replayed_by_override(
    ui: Ui, page: Page, output_dir: Path
) -> None:
    letter = ui.letter("shop.Looping")
    sign_in(page, ui.operator)
    page.goto("/dead-letters?error_type=shop.Looping")
    expect(page.locator(f'tr[data-id="{letter.id}"] [data-quarantined]')).to_have_text(
        "quarantined"
    )
    page.goto(f"/dead-letters/{letter.id}")
    expect(page.locator(".quarantine-card")).to_contain_text("Came back dead after 3 replays")
    shots = output_dir / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=shots / "dead-letter-quarantined.png", full_page=True)
    # A preview changes nothing, and without the override it would skip the letter.
    page.get_by_role("button", name="Preview", exact=True).click()
    expect(page.locator("[data-preview-summary]")).to_contain_text("Would send 0 of 1")
    expect(page.locator("[data-preview-skipped]")).to_contain_text("quarantined")
    page.go_back()
    page.locator("[data-override-quarantine]").check()
    page.get_by_role("button", name="Preview", exact=True).click()
    expect(page.locator("[data-preview-summary]")).to_contain_text("Would send 1 of 1")
    expect(page.locator("body")).to_contain_text("redrive-replays: 4")
    page.screenshot(path=shots / "replay-preview.png", full_page=True)
    assert ui.store.dead_letter_by_id(letter.id) is not None

    page.go_back()
    page.locator("[data-override-quarantine]").check()
    page.get_by_role("button", name="Replay", exact=True).click()
    confirm(page, "Replay")
    expect(page.locator(".flash-ok")).to_contain_text(f"Replayed dead letter {letter.id}")
    entry = audited(ui, "replay", letter.id)
    assert entry.detail is not None and entry.detail["override_quarantine"] is True
    assert audited(ui, "replay-dry-run", letter.id).actor == "ui-operator"


def test_a_bulk_replay_preview_and_a_scheduled_job(ui: Ui, page: Page) -> None:
    sign_in(page, ui.operator)
    page.goto("/dead-letters?error_type=json.decoder.JSONDecodeError")
    page.get_by_role("button", name="Replay all 4…").click()
    expect(page.locator("[data-preview-summary]")).to_contain_text("Would send 4 of 4")
    expect(page.locator("[data-preview] table tbody tr")).to_have_count(1)
    expect(page.locator("table tbody tr td.mono", has_text="redrive-error-type")).to_have_count(1)
    page.go_back()
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0, tzinfo=None)
    page.locator("[data-start-at]").fill(tomorrow.isoformat())
    page.get_by_role("button", name="Replay all 4…").click()
    expect(page.locator("#summary-title")).to_contain_text(f"from {tomorrow:%Y-%m-%d %H:%M:%S} UTC")
    page.get_by_role("button", name="Replay these 4").click()
    confirm(page, "Replay these 4")
    expect(page.locator(".flash-ok")).to_contain_text("scheduled")
    expect(page.locator("[data-job-state]")).to_have_text("scheduled")
    expect(page.locator("[data-start-at]")).to_contain_text(f"{tomorrow:%Y-%m-%d %H:%M:%S}")
    expect(page.locator("[data-job-finished]")).to_have_text("not started")
    page.get_by_role("button", name="Cancel job…").click()
    confirm(page, "Cancel job")
    expect(page.locator(".flash-ok")).to_contain_text("cancelled")
    # Nothing was tried: the bar stays empty, not full.
    expect(page.locator("[data-job-percent]")).to_have_text("0%")
    assert page.locator("[data-job-bar]").evaluate("bar => bar.value") == 0
