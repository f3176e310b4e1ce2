"""What the browser tests share: the seeded service they drive (:class:`Ui`, made by
the ``ui`` fixture of ``conftest.py``), and the steps of an operator's session.

One service per test module, seeded with dead letters (sent to the DLQ by "consumers"
through the requests topic, and invalid requests) and pending retries. Each scenario
uses its own error type or key, so tests do not depend on each other's order.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import uvicorn
from confluent_kafka.admin import AdminClient, NewTopic
from playwright.sync_api import Page, expect

from redrive.deadlines import Deadline
from redrive.ports import free_port
from redrive.reasons import DeadLetterReason
from redrive.records import DeadLetterRecord, RequestCoordinates
from redrive.service.filters import DeadLetterFilter
from redrive.service.operations import Operations
from redrive.service.service import RetryService
from redrive.service.store import AuditRecord, DeadLetter, Store
from tests.conftest import wait_for_topics
from tests.integration.service_harness import (
    Collector,
    Delivery,
    now_ms,
    produce,
    request_headers,
)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
XSS_VALUE = "<script>window.__xss = 1</script>"
XSS_MESSAGE = '<img src=x onerror="window.__xss=2">bad input'
TRACE = """Traceback (most recent call last):
  File "/app/shop/consumer.py", line 88, in handle
    charge(order)
  File "/app/shop/payments.py", line 41, in charge
    raise PaymentDeclined(response.code, response.text)
shop.PaymentDeclined: card declined by issuer (code 51)"""


@dataclass
class Ui:
    service: RetryService
    ops: Operations
    store: Store
    url: str
    bootstrap: str
    orders: str
    payments: str
    operator: str
    viewer: str
    pending_ids: dict[bytes, int]

    def letter(self, error_type: str) -> DeadLetter:
        rows, _ = self.ops.dead_letters(DeadLetterFilter(error_type=error_type), limit=10)
        assert rows, f"no dead letter with error type {error_type}"
        return rows[0]


def create_topics(bootstrap: str, *prefixes: str) -> list[str]:
    names = [f"{p}-{uuid.uuid4().hex[:8]}" for p in prefixes]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, num_partitions=1) for n in names]).values():
        future.result(timeout=30)
    wait_for_topics(admin, names)
    return names


def dead_request(
    topic: str, error_type: str, key: bytes | None, value: bytes | None, **kw: Any
) -> dict[str, Any]:
    user = kw.pop("user_headers", [("trace-id", b"t-" + (key or b"none"))])
    offset = kw.pop("offset", 1000 + len(error_type))
    fields = {
        "send_to": "dlq",
        "error_type": error_type,
        "error_message": kw.pop("message", f"{error_type.rsplit('.', 1)[-1]} while handling"),
        "reason": kw.pop("reason", "attempts exhausted (5 of 5)"),
        "group": kw.pop("group", "checkout"),
        "attempt": kw.pop("attempt", 5),
        "original_topic": topic,
        "original_partition": 0,
        "original_offset": offset,
        "original_timestamp": now_ms() - 3_600_000,
        **kw,
    }
    return {
        "key": key,
        "value": value,
        "headers": request_headers(topic, now_ms(), user, **fields),
    }


def seed(ui_topics: tuple[str, str, str], requests_topic: str, bootstrap: str) -> int:
    """Produce the dead letters and pending retries; returns how many dead letters."""
    orders, payments, inventory = ui_topics
    order = json.dumps({"order": 7, "sku": "A-1", "qty": 2, "customer": {"id": 42}}).encode()
    records = [
        dead_request(
            orders,
            "shop.PaymentDeclined",
            b"order-7",
            order,
            message="card declined by issuer (code 51)",
            error_trace=TRACE,
            user_headers=[("trace-id", b"trace-7"), ("tenant", b"acme")],
        ),
        dead_request(orders, "shop.PriceMismatch", b"order-8", b'{"order": 8, "price": 10}'),
        dead_request(orders, "shop.OutOfStock", b"order-9", b'{"order": 9}'),
        dead_request(orders, "shop.Fraud", b"order-10", b'{"order": 10}'),
        dead_request(orders, "shop.NoScript", b"order-11", b'{"order": 11}'),
        # Came back dead from its third replay: the loop guard quarantines it.
        dead_request(
            orders, "shop.Looping", b"order-12", b'{"order": 12}', replays=3, replay_of=41
        ),
        *[
            dead_request(
                orders, "shop.Timeout", f"order-t{i}".encode(), b'{"slow": true}', offset=i
            )
            for i in range(3)
        ],
        dead_request(
            orders,
            "xss.Probe",
            b"<b>key</b>",
            XSS_VALUE.encode(),
            message=XSS_MESSAGE,
            user_headers=[("note", b"<script>window.__xss = 3</script>")],
        ),
        dead_request(
            inventory,
            "codec.DecodeError",
            b"\x00\x01sku",
            bytes(range(48)) + b"\xff\xfe<tail>",
            message="'utf-8' codec can't decode byte 0xff in position 48",
            group="inventory-sync",
        ),
        dead_request(
            payments,
            "billing.InvoiceRejected",
            b"invoice-2024-0042",
            json.dumps(
                {
                    "invoice": "2024-0042",
                    "lines": [{"sku": "A-1", "amount": "19.90"}, {"sku": "B-7", "amount": "5.00"}],
                    "currency": "EUR",
                    "note": "multi\nline",
                }
            ).encode(),
            message="invoice total 24.90 does not match order total 25.90",
            error_trace=TRACE.replace("PaymentDeclined", "InvoiceRejected"),
            group="billing",
            attempt=3,
            reason="non-retryable error: billing.InvoiceRejected",
        ),
        *[
            dead_request(
                inventory,
                "json.decoder.JSONDecodeError",
                f"sku-{i}".encode(),
                b"{not json",
                message="Expecting property name enclosed in double quotes: line 1 column 2",
                group="inventory-sync",
                offset=500 + i,
            )
            for i in range(4)
        ],
        {"value": b"a request without redrive headers"},
        {"value": b"junk", "headers": [("redrive-destination", b"x"), ("redrive-retry-at", b"x")]},
    ]
    due = now_ms()
    pending = [
        {
            "key": f"pay-{i}".encode(),
            "value": json.dumps({"payment": i}).encode(),
            "headers": request_headers(
                payments,
                due + delay_s * 1000,
                [("trace-id", f"pay-trace-{i}".encode())],
                group="billing",
                attempt=i,
                original_topic=payments,
                original_partition=0,
                original_offset=900 + i,
            ),
        }
        for i, delay_s in enumerate((600, 3600, 7200, 86_400), start=1)
    ]
    produce(bootstrap, requests_topic, records + pending)
    return len(records)


def serve(app: Any) -> tuple[uvicorn.Server, threading.Thread, int]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, name="ui-test-http", daemon=True)
    thread.start()
    deadline = Deadline(20)
    while not server.started and not deadline.passed():
        time.sleep(0.02)
    assert server.started, "the UI's HTTP server did not start"
    return server, thread, port


def sign_in(page: Page, token: str) -> None:
    page.goto("/login")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator(".flash-ok")).to_contain_text("Signed in as")


def confirm(page: Page, button: str) -> None:
    dialog = page.locator("dialog#confirm")
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name=button, exact=True).click()


def audited(ui: Ui, action: str, letter_id: int, timeout_s: float = 10) -> AuditRecord:
    """The audit entry of `action` on the letter; waits for it, since a replay job
    writes its entry when it ends, just after its page shows it done."""
    deadline = Deadline(timeout_s)
    while True:
        entries, _ = ui.ops.audit_log(limit=100)
        for entry in entries:
            if entry.action == action and letter_id in entry.ids:
                return entry
        if deadline.passed():
            raise AssertionError(f"no audit entry {action} for {letter_id}: {entries}")
        time.sleep(0.1)


def delivered(collector: Collector, key: bytes, timeout_s: float = 20) -> Delivery:
    deadline = Deadline(timeout_s)
    while not deadline.passed():
        for delivery in collector.poll_until(len(collector.received) + 1, 0.5):
            if delivery.key == key:
                return delivery
    raise AssertionError(f"nothing with key {key!r} arrived on {collector.topic}")


def stored_letter(
    ui: Ui, key: bytes, offset: int, error_type: str, error_message: str
) -> DeadLetterRecord:
    """A letter of the orders topic as intake stores it (for ``store.insert_batch``):
    attempts exhausted in group ``checkout``, at ``offset`` of its topic."""
    return DeadLetterRecord(
        topic=ui.orders,
        key=key,
        value=b'{"stored": true}',
        headers=[],
        reason_code=DeadLetterReason.ATTEMPTS_EXHAUSTED,
        reason="attempts exhausted (5 of 5)",
        source="intake",
        attempt=5,
        request=RequestCoordinates("ui-stored", 0, offset),
        identity=uuid.uuid4().bytes,
        group="checkout",
        original_topic=ui.orders,
        original_partition=0,
        original_offset=offset,
        error_type=error_type,
        error_message=error_message,
    )
