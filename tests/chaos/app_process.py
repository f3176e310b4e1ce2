"""A consumer app for the fault tests, run as its own process so that a test can SIGKILL it.

    python tests/chaos/app_process.py --bootstrap HOST:PORT --topic T --strategy S
        --group G --requests-topic R --out EVENTS.jsonl [--policy P] [--transactional]
        [--instance-id I] [--ordering key]

One handler on topic T with strategy S (blocking, pause, topics, retry-topic, service,
or service-per-group: the service delivering to `<group>.<topic>.retry`), with
`ordering="key"` if `--ordering key` is given (service, topics, retry-topic), an `async def`
handler with `--async` (it awaits 0 to 20 ms first, so that records of different
keys end out of order; SLOW_S for a value ending in `:slow`, a record still running
when later ones are done: 6 s, or `REDRIVE_CHAOS_SLOW_S`). What the handler does with
a record is said by the end of its value:

- `:f<N>`: it fails its first N attempts (a retryable error), then succeeds; with N
  beyond the policy's retries (e.g. `:f9` under `200ms x3`) it never succeeds, and
  the record is dead-lettered once its attempts run out;
- `:x`: it fails fatally on every attempt (an exception listed in `fatal_on`): a dead
  letter at the first attempt;
- anything else: it succeeds.

Each call appends one JSON line to the events file: `{"event": "fail" | "ok",
"value", "attempt", "pid", "at_ms", "due_ms", "key", "seq", "ts_ms", "partition",
"fatal"}`:
due_ms is the redelivery's `redrive-retry-at` (null on a first delivery and for
in-place retries); key is the record key (text, null if none); seq the sequence
number of a value `<name>:<seq>[:<marker>]` (the first all-digit field after the
first; null if there is none); ts_ms the original record's timestamp (its
`redrive-original-timestamp` on a redelivery); partition the original record's
partition; fatal whether a failure was the
fatal one. A line is one `write` on a file opened for appending, so it is either
wholly there or not at all, even after SIGKILL.

SIGTERM stops the app cleanly (it commits what it dealt with and exits 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from typing import cast

from redrive import App, Message, RetryTopic, Service, Topics
from redrive.consumer.strategies import Strategy
from redrive.logs import configure

SLOW_S = float(os.environ.get("REDRIVE_CHAOS_SLOW_S", "6"))
"""How long the async handler awaits a value ending in `:slow` before handling it."""


class Flaky(Exception):
    """The injected, retryable failure."""


class Fatal(Exception):
    """The injected failure that is never retried (listed in `fatal_on`)."""


def failures_of(value: str) -> int:
    head, sep, tail = value.rpartition(":f")
    return int(tail) if sep and head and tail.isdigit() else 0


def is_fatal(value: str) -> bool:
    return value.endswith(":x")


def seq_of(value: str) -> int | None:
    """`k0042:07:f1` -> 7; None for a value without a sequence number (`m-000012:f1`)."""
    for field in value.split(":")[1:]:
        if field.isdigit():
            return int(field)
    return None


def strategy_of(name: str, ordering: str | None) -> Strategy:
    """The strategy named on the command line, keeping key order if asked
    (``service-per-group``: the service, retries on the group's own topic)."""
    if name == "service-per-group":
        return Service(per_group_topic=True, ordering="key" if ordering else None)
    if ordering is None:
        return cast(Strategy, name)
    if name == "service":  # the retries back on the source topic, behind its backlog
        return Service(ordering="key", per_group_topic=False)
    kinds: dict[str, type[Topics]] = {"topics": Topics, "retry-topic": RetryTopic}
    return kinds[name](ordering="key")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--requests-topic", default="redrive.requests")
    parser.add_argument("--out", required=True)
    parser.add_argument("--policy", default="200ms x8")
    parser.add_argument(
        "--session-timeout-ms",
        default="6000",
        help="consumer group session timeout: how long the group waits for a killed member",
    )
    parser.add_argument(
        "--instance-id", default=None, help="static group membership (App(instance_id=...))"
    )
    parser.add_argument("--transactional", action="store_true", help="hand-offs in transactions")
    parser.add_argument("--ordering", choices=["key"], default=None, help="ordering of the handler")
    parser.add_argument(
        "--dead-letters", choices=["topic", "service"], default=None, help="where dead letters go"
    )
    parser.add_argument("--async", dest="use_async", action="store_true", help="async handler")
    args = parser.parse_args(argv)

    configure("json")
    fd = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pid = os.getpid()

    def record(event: str, message: Message, value: str, fatal: bool = False) -> None:
        retry = message.retry
        original = retry.original_timestamp if retry is not None else None
        line = json.dumps(
            {
                "event": event,
                "value": value,
                "attempt": message.attempt,
                "pid": pid,
                "at_ms": time.time_ns() // 1_000_000,
                "due_ms": retry.retry_at if retry is not None else None,
                "key": message.key.decode(errors="replace") if message.key is not None else None,
                "seq": seq_of(value),
                "ts_ms": original if original is not None else message.timestamp_ms,
                "partition": (
                    retry.original_partition
                    if retry is not None and retry.original_partition is not None
                    else message.partition
                ),
                "fatal": fatal,
            }
        )
        os.write(fd, (line + "\n").encode())

    def handle(message: Message) -> None:
        value = (message.raw_value or b"").decode()
        if is_fatal(value):
            record("fail", message, value, fatal=True)
            raise Fatal(f"injected fatal failure of {value}")
        if message.attempt <= failures_of(value):
            record("fail", message, value)
            raise Flaky(f"injected failure {message.attempt} of {value}")
        record("ok", message, value)

    async def handle_async(message: Message) -> None:
        slow = (message.raw_value or b"").endswith(b":slow")
        await asyncio.sleep(SLOW_S if slow else random.uniform(0, 0.02))
        handle(message)

    app = App(
        args.bootstrap,
        group=args.group,
        requests_topic=args.requests_topic,
        instance_id=args.instance_id,
        transactional=args.transactional,
        consumer_kafka={
            "session.timeout.ms": args.session_timeout_ms,
            "heartbeat.interval.ms": "1000",
        },
    )
    app.add_handler(
        args.topic,
        handle_async if args.use_async else handle,
        policy=args.policy,
        strategy=strategy_of(args.strategy, args.ordering),
        fatal_on=Fatal,
        dead_letters=args.dead_letters,
    )
    ordering = f", ordering={args.ordering}" if args.ordering else ""
    print(f"app_process: pid {pid}, {args.strategy} on {args.topic}{ordering}", flush=True)
    app.run()
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
