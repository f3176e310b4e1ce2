"""A share app run as its own process, so that a test can SIGKILL it mid-record.

    python tests/integration/share_process.py BOOTSTRAP TOPIC GROUP REQUESTS_TOPIC OUT

Its handler appends one JSON line per event to OUT (one ``write`` on a file opened
for appending: a line is whole or absent, even after SIGKILL): ``{"event": "start" |
"ok" | "fail" | "blocked", "value", "attempt", "delivery_count", "redelivered"}``. A
value starting with ``retry`` fails on its first copy (``redelivered`` false: not yet
brought back by the retry service), and is retried in 1 s through the service. Once
the process has failed on a record, the next record it starts blocks ("blocked")
until the process is killed.
"""

from __future__ import annotations

import json
import os
import sys
import threading

from redrive import Message, ShareApp


def main() -> None:
    bootstrap, topic, group, requests_topic, out = sys.argv[1:6]
    failed = threading.Event()

    def write(event: str, message: Message) -> None:
        line = json.dumps(
            {
                "event": event,
                "value": (message.raw_value or b"").decode(),
                "attempt": message.attempt,
                "delivery_count": message.delivery_count,
                "redelivered": message.retry is not None,
                "pid": os.getpid(),
            }
        )
        with open(out, "a") as events:
            events.write(line + "\n")

    def handle(message: Message) -> None:
        if failed.is_set():
            write("blocked", message)
            threading.Event().wait()  # until SIGKILL
        write("start", message)
        if (message.raw_value or b"").startswith(b"retry") and message.retry is None:
            write("fail", message)
            failed.set()
            raise RuntimeError("downstream unavailable")
        write("ok", message)

    app = ShareApp(bootstrap, group=group, requests_topic=requests_topic)
    app.add_handler(topic, handle, policy="1s x3")
    app.run()


if __name__ == "__main__":
    main()
