"""A redrive consumer: retry through the retry service, dead letters in its store.

Run against the local stack:

    redrive local up
    redrive serve &                    # the retry service (embedded default)
    python examples/consumer_quickstart.py

Then produce to `orders` (e.g. with kcat) and watch failures come back when due.
REDRIVE_BOOTSTRAP overrides the broker; EXAMPLE_MAX_MESSAGES stops after N handled
records (used by the test that keeps this example working).
"""

from __future__ import annotations

import contextlib
import json
import os

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

import redrive
from redrive.local import LocalStack


class PaymentDeclined(Exception):
    """Worth retrying: the gateway may accept later."""


def main() -> None:
    bootstrap = os.environ.get("REDRIVE_BOOTSTRAP") or LocalStack().status().bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic("orders", 3)]).values():
        with contextlib.suppress(KafkaException):  # it may exist already
            future.result(30)
    limit = int(os.environ.get("EXAMPLE_MAX_MESSAGES", "0"))
    handled = 0

    app = redrive.App(bootstrap, group="billing")

    @app.handler(
        "orders",
        policy="5s x3, 1m x2",  # 5s, 5s, 5s, 1m, 1m: six attempts in all
        strategy="service",  # wait in the retry service; the partition keeps flowing
        retry_on=[PaymentDeclined],  # anything else is fatal: straight to the dead letters
        value_deserializer=json.loads,  # a value that is not JSON is a dead letter too
    )
    def charge(message: redrive.Message) -> None:
        nonlocal handled
        order = message.value
        print(f"order {order['id']}: attempt {message.attempt}")
        if order.get("declined_until_attempt", 0) >= message.attempt:
            raise PaymentDeclined(f"order {order['id']} declined")
        handled += 1
        if limit and handled >= limit:
            app.stop()

    app.run()  # until Ctrl-C / SIGTERM; commits what was handled


if __name__ == "__main__":
    main()
