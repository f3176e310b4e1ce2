"""Key queues as operators see them (``ordering="key"``), on the real service, broker
and database: each pending retry's place in its key's queue, one queue listed head
first, make-due refused for a held row, and cancel and release letting the next go.

The rows arrive as real retry requests (``redrive-order: key | behind | release``) on
the service's requests topic.
"""

from __future__ import annotations

import base64
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from redrive.clock import now_ms
from redrive.deadlines import Deadline
from redrive.headers import Order
from redrive.service.filters import INT64_MAX, INT64_MIN, encode_cursor
from redrive.service.service import RetryService
from tests.integration.service_harness import (
    Collector,
    Delivery,
    dead_letters,
    fresh_database,
    produce,
    request_headers,
    running_service,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.integration

GROUP = "billing"
FAR = 3_600_000  # a head waiting this long stays put for the whole test


@dataclass
class Env:
    service: RetryService
    api: httpx.Client
    topic: str
    bootstrap: str
    operator: dict[str, str]
    token: str

    def request(
        self,
        key: bytes,
        offset: int,
        order: Order,
        *,
        attempt: int = 1,
        due_in_ms: int = 0,
        destination: str | None = None,
    ) -> dict[str, Any]:
        """A retry request of partition 0 of `topic` (the queue is the key's there),
        delivered to `topic` unless told another `destination`."""
        return {
            "key": key,
            "value": f"v{offset}".encode(),
            "headers": request_headers(
                destination or self.topic,
                now_ms() + due_in_ms,
                attempt=attempt,
                group=GROUP,
                original_topic=self.topic,
                original_partition=0,
                original_offset=offset,
                order=order,
            ),
        }

    def send(self, *records: dict[str, Any]) -> None:
        produce(self.bootstrap, self.service.settings.requests_topic, list(records))

    def pending(self) -> list[dict[str, Any]]:
        response = self.api.get("/api/v1/pending", params={"limit": 500})
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    def one(self, pending_id: int) -> dict[str, Any]:
        response = self.api.get(f"/api/v1/pending/{pending_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def queue(self, pending_id: int, **params: Any) -> dict[str, Any]:
        response = self.api.get(f"/api/v1/pending/{pending_id}/queue", params=params)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def ids_by_offset(self, key: bytes, count: int) -> dict[int, int]:
        """The pending ids of `key`'s rows by original offset, once `count` are stored."""
        found: dict[int, int] = {}

        def stored() -> bool:
            found.clear()
            for item in self.pending():
                detail = self.one(item["id"])
                if detail["key"]["base64"] == _b64(key):
                    found[detail["original"]["offset"]] = item["id"]
            return len(found) >= count

        wait_until(stored, 30, f"{count} pending rows of key {key!r}")
        return dict(found)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.fixture(scope="module")
def env(bootstrap: str, database_url: str) -> Iterator[Env]:
    topic = f"kq-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(timeout=30)
    settings = settings_for(bootstrap, fresh_database(database_url), allowed_destinations=[topic])
    with running_service(settings) as service:
        token = service.tokens.create("olivia", "operator")
        operator = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as api:
            yield Env(service, api, topic, bootstrap, operator, token)


def arrived(collector: Collector, key: bytes, count: int, timeout_s: float = 30) -> list[Delivery]:
    """The deliveries of `key` so far, once at least `count` arrived (or the time is up)."""
    deadline = Deadline(timeout_s)
    while True:
        mine = [d for d in collector.received if d.key == key]
        if len(mine) >= count or deadline.passed():
            return mine
        collector.poll_until(len(collector.received) + 1, 0.2)


def test_each_row_shows_its_place_and_the_queue_lists_head_first(env: Env) -> None:
    key = f"a-{uuid.uuid4().hex[:6]}".encode()
    env.send(
        env.request(key, 10, "key", attempt=2, due_in_ms=FAR),
        env.request(key, 11, "behind", attempt=0),
        env.request(key, 12, "behind", attempt=0),
        {
            "key": key + b"-free",
            "value": b"free",
            "headers": request_headers(env.topic, now_ms() + FAR, group=GROUP),
        },
    )
    ids = env.ids_by_offset(key, 3)
    head, first, second = ids[10], ids[11], ids[12]
    listed = {item["id"]: item for item in env.pending()}
    free = next(i for i, item in listed.items() if item["order_state"] is None)
    assert listed[free]["queue"] is None and listed[free]["delivered_ms"] is None

    # The list: each row's state, its queue's head and how many wait behind the head.
    assert listed[head]["order_state"] == "head"
    assert listed[first]["order_state"] == listed[second]["order_state"] == "behind"
    queue_id = listed[head]["queue"]["id"]
    assert re.fullmatch(r"[0-9a-f]{32}", queue_id)
    for pending_id in (head, first, second):
        assert listed[pending_id]["queue"] == {
            "id": queue_id,
            "head_id": head,
            "length": 3,
            "behind": 2,
        }
    # The detail adds the row's place in its queue; the existing fields stay.
    detail = env.one(second)
    assert detail["queue"]["position"] == 2 and detail["order_state"] == "behind"
    assert detail["original"]["offset"] == 12 and detail["value"]["text"] == "v12"

    # One key's queue, head first, whole or page by page.
    whole = env.queue(second)
    assert whole["id"] == second and whole["order_state"] == "behind"
    assert whole["queue"]["position"] == 2 and whole["queue"]["head_id"] == head
    assert [i["id"] for i in whole["items"]] == [head, first, second]
    assert [i["original"]["offset"] for i in whole["items"]] == [10, 11, 12]
    assert [i["position"] for i in whole["items"]] == [0, 1, 2]
    assert [i["order_state"] for i in whole["items"]] == ["head", "behind", "behind"]
    assert whole["next_cursor"] is None
    paged, cursor = [], None
    while True:
        page = env.queue(head, limit=1, **({"cursor": cursor} if cursor else {}))
        paged += [(i["id"], i["position"]) for i in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert paged == [(head, 0), (first, 1), (second, 2)]

    # Refusals: a row without a queue, a gone row, a cursor this API did not return.
    assert env.api.get(f"/api/v1/pending/{free}/queue").status_code == 404
    assert env.api.get("/api/v1/pending/987654321/queue").status_code == 404
    assert env.api.get(f"/api/v1/pending/{head}/queue?cursor=AAAA").status_code == 400

    # Making a row behind its head due now would not move it: refused, saying why.
    refused = env.api.post(f"/api/v1/pending/{first}/retry-now", headers=env.operator)
    assert refused.status_code == 409, refused.text
    assert refused.json()["detail"] == (
        f"pending retry {first} waits behind its key's head (pending retry {head}): a key's "
        "retries go in order, from their head; make the head due or cancel it instead"
    )
    assert env.one(first)["order_state"] == "behind"

    # The web UI: a badge per row, the queue page, and the refusal as a message.
    cookies = {"redrive_session": env.token, "redrive_csrf": "c" * 43}
    with httpx.Client(base_url=env.api.base_url, timeout=30, cookies=cookies) as web:
        page_html = web.get("/pending").text
        assert f'href="/pending/{second}/queue?back=' in page_html
        assert page_html.count("badge-order-behind") >= 2 and "2 behind" in page_html
        queue_html = web.get(f"/pending/{second}/queue").text
        rows = re.findall(r'<tr data-id="(\d+)"', queue_html)
        assert [int(r) for r in rows] == [head, first, second]
        assert web.get(f"/pending/{free}/queue").status_code == 404
        posted = web.post(
            f"/pending/{first}/retry-now",
            data={"csrf": "c" * 43, "back": f"/pending/{first}/queue"},
            follow_redirects=True,
        )
        assert posted.status_code == 200
        assert (
            f"Retry now refused: pending retry {first} waits behind its key&#39;s head"
            in posted.text
        )


def test_cancel_and_release_let_the_next_go_and_a_cancelled_row_behind_just_leaves(
    env: Env,
) -> None:
    key, other = f"b-{uuid.uuid4().hex[:6]}".encode(), f"c-{uuid.uuid4().hex[:6]}".encode()
    collector = Collector(env.bootstrap, env.topic)
    try:
        env.send(
            env.request(key, 20, "key", due_in_ms=FAR),
            env.request(key, 21, "behind", attempt=0),
            env.request(key, 22, "behind", attempt=0),
            env.request(other, 30, "key", due_in_ms=FAR),
            env.request(other, 31, "behind", attempt=0),
            env.request(other, 32, "behind", attempt=0),
        )
        ids = env.ids_by_offset(key, 3)
        others = env.ids_by_offset(other, 3)

        # Cancelling a row behind its head: it leaves its queue, nothing else moves.
        cancelled = env.api.post(f"/api/v1/pending/{others[31]}/cancel", headers=env.operator)
        assert cancelled.status_code == 200, cancelled.text
        left = env.queue(others[30])
        assert [i["id"] for i in left["items"]] == [others[30], others[32]]
        assert [i["order_state"] for i in left["items"]] == ["head", "behind"]
        assert left["queue"] == {
            "id": left["queue"]["id"],
            "head_id": others[30],
            "length": 2,
            "behind": 1,
            "position": 0,
        }

        # Cancelling the head: the rows behind it go at once, together (one run, named
        # by its first row), and wait for their consumer.
        cancelled_at = now_ms()
        cancelled = env.api.post(f"/api/v1/pending/{ids[20]}/cancel", headers=env.operator)
        assert cancelled.status_code == 200, cancelled.text
        run = arrived(collector, key, 2)
        assert [d.value for d in run] == [b"v21", b"v22"]
        assert [d.header("redrive-run") for d in run] == [str(ids[21]).encode()] * 2
        # Woken at once (NOTIFY), not at the schedulers' next idle check (5 s).
        waited = run[0].received_ms - cancelled_at
        assert waited < 3000, f"the next went {waited} ms after its head was cancelled"
        for offset in (21, 22):
            wait_until(
                lambda o=offset: env.one(ids[o])["order_state"] == "delivered",
                30,
                f"{offset} delivered",
            )
        now = env.one(ids[21])
        assert now["delivered_ms"] is not None and now["queue"]["head_id"] == ids[21]
        assert env.one(ids[22])["queue"]["head_id"] == ids[21]
        refused = env.api.post(f"/api/v1/pending/{ids[22]}/retry-now", headers=env.operator)
        assert refused.status_code == 409, refused.text
        assert refused.json()["detail"].startswith(
            f"pending retry {ids[22]} was delivered and waits for its consumer"
        )

        # Its consumer is done with each (release requests): each leaves its queue, and
        # nothing is delivered again.
        env.send(env.request(key, 21, "release", attempt=0))
        wait_until(
            lambda: env.api.get(f"/api/v1/pending/{ids[21]}").status_code == 404,
            30,
            "21 released",
        )
        assert env.one(ids[22])["order_state"] == "delivered"
        env.send(env.request(key, 22, "release", attempt=0))
        wait_until(
            lambda: env.api.get(f"/api/v1/pending/{ids[22]}").status_code == 404,
            30,
            "22 released",
        )
        collector.drain(1.0)
        assert [d.value for d in arrived(collector, key, 2)] == [b"v21", b"v22"]
        assert arrived(collector, other, 0) == []  # its head is not due yet
    finally:
        collector.close()
    reasons = {
        (bytes(r["msg_key"]), r["original_offset"]): r["reason_code"]
        for r in dead_letters(env.service.database_url)
    }
    assert reasons[(key, 20)] == "cancelled" and reasons[(other, 31)] == "cancelled"
    # Nothing of this reached the audit log wrongly: the refusals are not actions.
    actions = [a["action"] for a in env.api.get("/api/v1/audit").json()["items"]]
    assert "retry-now" not in actions and actions.count("cancel") >= 2


def test_making_a_head_due_delivers_its_run_and_then_it_waits_for_its_consumer(
    env: Env,
) -> None:
    key = f"d-{uuid.uuid4().hex[:6]}".encode()
    collector = Collector(env.bootstrap, env.topic)
    try:
        env.send(
            env.request(key, 40, "key", due_in_ms=FAR), env.request(key, 41, "behind", attempt=0)
        )
        ids = env.ids_by_offset(key, 2)
        made = env.api.post(f"/api/v1/pending/{ids[40]}/retry-now", headers=env.operator)
        assert made.status_code == 200, made.text
        assert [d.value for d in arrived(collector, key, 2)] == [b"v40", b"v41"]
        for offset in (40, 41):
            wait_until(
                lambda o=offset: env.one(ids[o])["order_state"] == "delivered",
                30,
                f"{offset} delivered",
            )
        # A record arriving behind the run waits until its consumer is done with it.
        env.send(env.request(key, 42, "behind", attempt=0))
        later = env.ids_by_offset(key, 3)[42]
        time.sleep(0.5)  # long enough for the row behind to go, were it let go
        collector.drain(0.5)
        assert [d.value for d in arrived(collector, key, 2)] == [b"v40", b"v41"]
        assert env.one(later)["order_state"] == "behind"
    finally:
        collector.close()


def test_a_run_goes_where_its_head_goes(env: Env) -> None:
    # The route moved its retries to its group's own topic while the key waited (an App
    # upgraded to Service(ordering="key")'s default): the record put behind names the
    # new topic, its head the old one. Split, the one behind would come back first.
    key = f"m-{uuid.uuid4().hex[:6]}".encode()
    per_group = f"{GROUP}.{env.topic}.retry"
    admin = AdminClient({"bootstrap.servers": env.bootstrap})
    admin.create_topics([NewTopic(per_group, num_partitions=1)])[per_group].result(timeout=30)
    collector = Collector(env.bootstrap, env.topic)
    try:
        env.send(
            env.request(key, 60, "key", due_in_ms=FAR),
            env.request(key, 61, "behind", attempt=0, destination=per_group),
        )
        ids = env.ids_by_offset(key, 2)
        made = env.api.post(f"/api/v1/pending/{ids[60]}/retry-now", headers=env.operator)
        assert made.status_code == 200, made.text
        assert [d.value for d in arrived(collector, key, 2)] == [b"v60", b"v61"]
        assert {d.partition for d in arrived(collector, key, 2)} == {0}
    finally:
        collector.close()


def test_the_queue_view_survives_hostile_input(env: Env) -> None:
    """The new reads answer every id, cursor and limit with a 2xx or a clear 4xx:
    a cursor this API did not return, even one of extreme numbers, is never a 5xx."""
    key = f"e-{uuid.uuid4().hex[:6]}".encode()
    env.send(env.request(key, 50, "key", due_in_ms=FAR))
    (row,) = env.ids_by_offset(key, 1).values()
    extreme = encode_cursor(INT64_MAX, INT64_MIN, INT64_MAX)
    assert env.queue(row, cursor=extreme)["items"] == []
    assert env.queue(row, cursor=encode_cursor(INT64_MIN, INT64_MAX, INT64_MIN))["items"] != []
    cookies = {"redrive_session": env.token}
    with httpx.Client(base_url=env.api.base_url, timeout=30, cookies=cookies) as web:
        for value in ["%00", "a%00b", "%ED%A0%80", "9" * 40, "-1", "x" * 3000, extreme]:
            for path in (
                f"/api/v1/pending/{row}/queue?cursor={value}",
                f"/api/v1/pending/{row}/queue?limit={value}",
                f"/api/v1/pending/{value}/queue",
                f"/pending/{row}/queue?cursor={value}",
                f"/pending/{row}/queue?back={value}",
                f"/pending/{value}/queue",
            ):
                answer = web.get(path)
                assert answer.status_code < 500, (path, answer.text[:300])
        for value in ("0", str(INT64_MAX), "9" * 40):
            refused = web.get(f"/pending/{value}/queue")
            assert refused.status_code == 404, (value, refused.text[:300])
            answer = env.api.post(f"/api/v1/pending/{value}/retry-now", headers=env.operator)
            assert answer.status_code in (404, 422), (value, answer.text[:300])
