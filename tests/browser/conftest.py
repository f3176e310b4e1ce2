"""The browser tests' fixtures: a seeded service with its UI (one per test module),
Chromium (one per module), and a fresh browser context and page for each test."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

from redrive.deadlines import Deadline
from redrive.service.filters import PendingFilter
from redrive.service.web import create_app
from tests.browser.ui_harness import CHROMIUM, CHROMIUM_ARGS, Ui, create_topics, seed, serve
from tests.integration.service_harness import fresh_database, running_service, settings_for


@pytest.fixture(scope="module")
def ui(bootstrap: str, database_url: str) -> Iterator[Ui]:
    orders, payments, inventory = create_topics(bootstrap, "orders", "payments", "inventory")
    settings = settings_for(bootstrap, fresh_database(database_url))
    with running_service(settings) as service:
        app = create_app(service)
        server, thread, port = serve(app)
        try:
            ops, store = service.operations, service.store
            assert store is not None  # opened by running_service
            expected = seed((orders, payments, inventory), settings.requests_topic, bootstrap)
            deadline = Deadline(60)
            while not deadline.passed():
                stats = store.totals()
                if stats["dead_letters"]["total"] >= expected and stats["pending"]["total"] >= 4:
                    break
                time.sleep(0.2)
            assert store.totals()["dead_letters"]["total"] == expected
            rows, _ = ops.pending(PendingFilter(), limit=10)
            yield Ui(
                service=service,
                ops=ops,
                store=store,
                url=f"http://127.0.0.1:{port}",
                bootstrap=bootstrap,
                orders=orders,
                payments=payments,
                operator=service.tokens.create("ui-operator", "operator"),
                viewer=service.tokens.create("ui-viewer", "viewer"),
                pending_ids={r.msg_key: r.id for r in rows},
            )
        finally:
            server.should_exit = True
            thread.join(10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install-system-deps.sh (apt chromium)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def context(browser: Browser, ui: Ui) -> Iterator[BrowserContext]:
    ctx = browser.new_context(base_url=ui.url, viewport={"width": 1360, "height": 900})
    ctx.set_default_timeout(10_000)
    yield ctx
    ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    return context.new_page()
