"""`make bench`: every benchmark in one run on one private stack; a table at the end.

Each benchmark runs its peer in the same run on the same broker (raw confluent-kafka
for the service and the consumer strategies, plain PySpark for the pipeline) and
prints the ratio first, then the absolute figures.

    python -m bench                 # full sizes (about 15 minutes on 2 cores)
    python -m bench --quick         # tiny sizes: checks the code runs, measures nothing
    python -m bench service precision   # only some
    python -m bench --quick --bootstrap HOST:PORT --database-url URL  # on running servers
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shutil
import tempfile
from pathlib import Path
from typing import Any

import psutil

from bench import (
    consumer,
    groups,
    kafka_raw,
    relay,
    replay_jobs,
    service,
    share,
    signing_cost,
)
from bench.common import Result, Servers, fresh_database, print_table, servers
from redrive.logs import configure

SIZES = {
    "full": {
        "raw": 300_000,
        "e2e": 100_000,
        "precision_rate": 2000,
        "precision_s": 60,
        "due_within_ms": 10_000,
        "pending": 1_000_000,
        "consumer": 300_000,
        "consumer_service": 30_000,
        "spark": 200_000,
        "replay": 5_000,
        "groups": 1_000_000,
    },
    "quick": {
        "raw": 2_000,
        "e2e": 1_000,
        "precision_rate": 100,
        "precision_s": 3,
        # Still waiting in the store (due a second or more after sending), for less.
        "due_within_ms": 2_000,
        "pending": 5_000,
        "consumer": 2_000,
        "consumer_service": 1_000,
        "spark": 500,
        "replay": 1_000,
        "groups": 5_000,
    },
}
ALL = ["raw", "service", "precision", "pending", "consumer", "spark", "replay", "groups"]
REPLAY_RATE = 500.0


def machine() -> str:
    return (
        f"{platform.processor() or platform.machine()}, {psutil.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}"
    )


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("only", nargs="*", help=f"benchmarks to run, of: {' '.join(ALL)}")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--bootstrap",
        help="run on this broker, left running, instead of a private stack (with --database-url)",
    )
    parser.add_argument(
        "--database-url",
        help="a database on the PostgreSQL server to run on (with --bootstrap); "
        "each benchmark makes databases of its own next to it",
    )
    args = parser.parse_args(argv)
    if (args.bootstrap is None) != (args.database_url is None):
        parser.error("--bootstrap and --database-url go together")
    unknown = set(args.only) - set(ALL)
    if unknown:
        parser.error(f"unknown benchmark(s) {sorted(unknown)}; choose from {ALL}")
    configure("console", level=logging.WARNING)
    size = SIZES["quick" if args.quick else "full"]
    chosen = args.only or ALL
    results: list[Result] = []
    workdir = Path(tempfile.mkdtemp(prefix="redrive-bench-logs-"))
    print(f"machine: {machine()}")
    with servers(args.bootstrap, args.database_url) as stack:
        # The limit is the best of its rounds; so is everything measured against it.
        rounds = 1 if args.quick else 3
        raw = kafka_raw.run(stack.bootstrap, size["raw"], rounds=rounds)
        print(f"raw kafka: {raw}")
        results.append(
            Result("1 raw Kafka passthrough", "1.00x (the limit)", "-", None, _round(raw))
        )
        limit = raw["end_to_end_per_s"]
        if "service" in chosen:
            results += _service_end_to_end(stack, size["e2e"], rounds, limit, workdir)
        if "precision" in chosen:
            p = service.precision(
                stack.bootstrap,
                stack.database_url,
                size["precision_rate"],
                size["precision_s"],
                workdir,
                due_within_ms=size["due_within_ms"],
            )
            print(f"precision: {p}")
            results.append(
                Result(
                    "3 scheduling precision",
                    f"p99 {p['p99_ms']} ms late",
                    "p99 < 50 ms, never early",
                    p["p99_ms"] < 50 and p["early"] == 0,
                    _round(p),
                )
            )
        if "pending" in chosen:
            results += _with_pending(stack.bootstrap, stack.database_url, size, limit, workdir)
        if "consumer" in chosen:
            c = consumer.run(stack.bootstrap, size["consumer"], rounds=rounds)
            print(f"consumer strategies: {c}")
            for variant in consumer.VARIANTS:
                ratio, noop = c["json"][variant]["ratio"], c["noop"][variant]["ratio"]
                results.append(
                    Result(
                        f"5 consumer {variant}",
                        f"{ratio:.2f}x of bare loop (json handler)",
                        ">= 0.80x",
                        ratio >= 0.8,
                        {
                            "per_s": round(c["json"][variant]["per_s"]),
                            "bare_per_s": round(c["json"]["bare"]["per_s"]),
                            "noop_ratio": round(noop, 2),
                            "noop_per_s": round(c["noop"][variant]["per_s"]),
                            "noop_bare_per_s": round(c["noop"]["bare"]["per_s"]),
                        },
                    )
                )
            success = c["json"]["topics"]["per_s"]
            for variant in consumer.FAILURE_PATHS:
                per_s = c["json"][variant]["per_s"]
                results.append(
                    Result(
                        f"5 consumer {variant}",
                        f"{per_s / success:.2f}x of the topics success path",
                        "-",
                        None,
                        {"per_s": round(per_s), "success_per_s": round(success)},
                    )
                )
            ordered = consumer.tier_order_paths(stack.bootstrap, size["consumer"], rounds)
            print(f"consumer key order through the tiers: {ordered}")
            for variant in consumer.TIER_ORDER_PATHS[1:]:
                results.append(
                    Result(
                        f"5 consumer tiers {variant}",
                        f"{ordered[variant]['ratio']:.2f}x of the topics success path",
                        "-",
                        None,
                        {
                            "n": size["consumer"],
                            "per_s": round(ordered[variant]["per_s"]),
                            "success_per_s": round(ordered["topics"]["per_s"]),
                        },
                    )
                )
            paths = consumer.service_paths(
                stack.bootstrap, stack.database_url, size["consumer"], workdir, rounds
            )
            print(f"consumer failure paths through the service: {paths}")
            for variant in consumer.SERVICE_PATHS[1:]:
                results.append(
                    Result(
                        f"5 consumer {variant}",
                        f"{paths[variant]['ratio']:.2f}x of the service success path",
                        "-",
                        None,
                        {
                            "n": size["consumer"],
                            "per_s": round(paths[variant]["per_s"]),
                            "success_per_s": round(paths["service"]["per_s"]),
                        },
                    )
                )
            results += _key_order_costs(ordered, paths)
            results += _signed_consumer(c["json"], paths)
            results += _share(stack.bootstrap, size["consumer_service"], rounds)
        if "spark" in chosen:
            results += _spark(stack.bootstrap, size["spark"])
        if "replay" in chosen:
            r = replay_jobs.run(
                stack.bootstrap, stack.database_url, size["replay"], REPLAY_RATE, workdir
            )
            print(f"replay job: {r}")
            paced = r["job_s"] / r["target_s"]
            results.append(
                Result(
                    "7 replay job",
                    f"{paced:.2f}x of n/rate ({r['target_s']:.0f} s); raw "
                    f"{r['raw_produce_per_s'] / r['achieved_per_s']:.0f}x faster",
                    "0.8x to 1.2x",
                    0.8 <= paced <= 1.2,
                    _round(r),
                )
            )
        if "groups" in chosen:
            results += _groups(stack.database_url, size["groups"])
    # The services' logs matter when a run fails (its error names them); not after.
    shutil.rmtree(workdir, ignore_errors=True)
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=2, default=str))
    return results


WORKER_COUNTS = (1, 2, 3)
SIGNED_WORKER_COUNTS = (1, 2)
"""The runs measured again with every request signed and signatures required."""


def _groups(server_url: str, n: int) -> list[Result]:
    """Benchmark 8: migration 012 grouping `n` stored letters, and the group reads."""
    g = groups.run(server_url, n, fresh_database)
    print(f"error groups: {g}")
    return [
        Result(
            f"8 error groups migration, {n:,} letters",
            f"{g['letters_per_s']:,.0f} letters/s ({g['migrate_s']:.0f} s)",
            "-",
            None,
            _round(g),
        ),
        Result(
            f"8 error groups list, {n:,} letters",
            f"{g['list_ms']:.0f} ms for the 50 largest",
            "-",
            None,
            _round({k: v for k, v in g.items() if k.endswith("_ms")}),
        ),
    ]


def _service_end_to_end(
    stack: Servers, n: int, rounds: int, limit: float, workdir: Path
) -> list[Result]:
    """Benchmark 2: the two relays, then one `redrive serve` each with 1, 2 and 3 workers
    (whole services as processes side by side), in interleaved rounds so that each
    meets the machine as the others do; the best of each. The goal is against the
    relay through PostgreSQL."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(rounds):
        runs.setdefault("relay", []).append(relay.relay_ceiling(stack.bootstrap, n))
        runs.setdefault("stored", []).append(
            relay.relay_ceiling(stack.bootstrap, n, server_url=stack.database_url)
        )
        runs.setdefault("kept", []).append(
            relay.relay_ceiling(stack.bootstrap, n, server_url=stack.database_url, idempotent=True)
        )
        for workers in WORKER_COUNTS:
            runs.setdefault(f"w{workers}", []).append(
                service.end_to_end(stack.bootstrap, stack.database_url, n, workdir, workers=workers)
            )
            if workers in SIGNED_WORKER_COUNTS:  # its peer, right after it
                runs.setdefault(f"w{workers} signed", []).append(
                    service.end_to_end(
                        stack.bootstrap,
                        stack.database_url,
                        n,
                        workdir,
                        workers=workers,
                        signed=True,
                    )
                )
    # The check alone, after the service runs (the machine as they left it).
    costs = signing_cost.check_costs()
    print(f"signature check alone, µs per request: {costs}")
    ceiling, stored = _best_of(runs["relay"]), _best_of(runs["stored"])
    print(f"relay ceiling (the Kafka work of benchmark 2 alone): {ceiling}")
    print(f"relay through PostgreSQL (the least a stored retry costs): {stored}")
    kept = _best_of(runs["kept"])
    print(f"idempotent relay through PostgreSQL (the least dropping repeats costs): {kept}")
    stored["of_ceiling"] = stored["per_s"] / ceiling["per_s"]
    kept["of_stored_ceiling"] = kept["per_s"] / stored["per_s"]
    results = [
        _ceiling("Kafka relay", ceiling, limit, "no service can pass it"),
        _ceiling(
            "relay through PostgreSQL", stored, limit, "no service storing retries can pass it"
        ),
        Result(
            "2 ceiling: idempotent relay through PostgreSQL",
            f"{kept['of_stored_ceiling']:.2f}x of the relay through PostgreSQL",
            "-",
            None,
            _round(kept),
        ),
    ]
    for workers in WORKER_COUNTS:
        e2e = _best_of(runs[f"w{workers}"])
        print(f"service end to end, {workers} worker(s): {e2e}")
        e2e["of_raw_kafka"] = e2e["per_s"] / limit
        e2e["of_ceiling"] = e2e["per_s"] / ceiling["per_s"]
        ratio = e2e["of_stored_ceiling"] = e2e["per_s"] / stored["per_s"]
        e2e["of_idempotent_ceiling"] = e2e["per_s"] / kept["per_s"]
        results.append(
            Result(
                f"2 service e2e, {workers} worker{'s' if workers > 1 else ''}",
                f"{ratio:.2f}x of the relay through PostgreSQL",
                ">= 0.7x",
                ratio >= 0.7,
                _round(e2e),
            )
        )
        if workers in SIGNED_WORKER_COUNTS:
            signed = _best_of(runs[f"w{workers} signed"])
            print(f"service end to end, {workers} worker(s), signed: {signed}")
            cost = signed["of_unsigned"] = signed["per_s"] / e2e["per_s"]
            signed["unsigned_per_s"] = e2e["per_s"]
            signed.update(costs)
            best = signed["ceiling"] = signing_cost.ceiling(
                e2e["cpu_us_per_msg"]["service"], signed["cpu_us_per_msg"]["service"], costs
            )
            results.append(
                Result(
                    f"2 service e2e, {workers} worker{'s' if workers > 1 else ''}, signed",
                    f"{cost:.2f}x of the unsigned run",
                    f">= 0.95x (ceiling {best:.2f}x where the service bounds it)",
                    cost >= 0.95,
                    _round(signed),
                )
            )
    return results


def _key_order_costs(
    tiers: dict[str, dict[str, float]], paths: dict[str, dict[str, float]]
) -> list[Result]:
    """Benchmark 5's ordered failure rows against their unordered peers of the same run:
    the tiers (with transactions) and the service, each as a user gets it by default
    (the service's ordered retries on the group's own topic, its unordered ones on the
    source), then the service's ordered row against the unordered one of its layout:
    the group's own topic, and the source topic (``per_group_topic=False``, no goal:
    a head's retry comes back behind the whole backlog, and every record of its key
    read meanwhile goes through the service)."""
    ordered = paths["service fail 10%, key order"]
    rows = []
    for name, row, unordered, goal in (
        ("tiers", tiers["fail 10%, txn, key order"], tiers["fail 10%, txn"], True),
        ("service", ordered, paths["service fail 10%"], True),
        ("service, per-group topic", ordered, paths["service fail 10%, per-group topic"], True),
        (
            "service, source topic",
            paths["service fail 10%, source topic, key order"],
            paths["service fail 10%"],
            False,
        ),
    ):
        cost = row["per_s"] / unordered["per_s"]
        rows.append(
            Result(
                f"5 consumer {name} fail 10%, key order vs unordered",
                f"{cost:.2f}x of the unordered row",
                ">= 0.5x" if goal else "- (the backlog's layout)",
                cost >= 0.5 if goal else None,
                {"per_s": round(row["per_s"]), "unordered_per_s": round(unordered["per_s"])},
            )
        )
    return rows


def _signed_consumer(
    strategies: dict[str, dict[str, float]], paths: dict[str, dict[str, float]]
) -> list[Result]:
    """Benchmark 5's signed rows against their unsigned peers of the same run: the
    service strategy's success path, and its 10% failing through a service that
    requires signatures."""
    rows = []
    for name, signed, unsigned in (
        (
            "5 consumer service, signed vs unsigned",
            strategies["service, signed"],
            strategies["service"],
        ),
        (
            "5 consumer service fail 10%, signed vs unsigned",
            paths["service fail 10%, signed"],
            paths["service fail 10%"],
        ),
    ):
        cost = signed["per_s"] / unsigned["per_s"]
        rows.append(
            Result(
                name,
                f"{cost:.2f}x of the unsigned row",
                ">= 0.95x",
                cost >= 0.95,
                {"per_s": round(signed["per_s"]), "unsigned_per_s": round(unsigned["per_s"])},
            )
        )
    return rows


def _with_pending(
    bootstrap: str, server_url: str, size: dict[str, int], limit: float, workdir: Path
) -> list[Result]:
    destination = "bench-pending-parking"
    from bench.common import create_topic

    database = fresh_database(server_url)
    fill_s = service.fill_pending(
        database, create_topic(bootstrap, destination, 1), size["pending"]
    )
    print(f"filled {size['pending']} pending rows in {fill_s:.1f}s")
    rate, seconds = size["precision_rate"], max(size["precision_s"] // 2, 3)
    p = service.precision(
        bootstrap,
        server_url,
        rate,
        seconds,
        workdir,
        database_url=database,
        due_within_ms=size["due_within_ms"],
    )
    print(f"precision with {size['pending']} pending: {p}")
    # The same run on an empty store just before, for the ratio that says what a
    # million rows cost (one worker each).
    empty = service.end_to_end(bootstrap, server_url, size["e2e"], workdir)
    e2e = service.end_to_end(bootstrap, server_url, size["e2e"], workdir, database_url=database)
    print(f"service end to end with {size['pending']} pending: {e2e}; empty store: {empty}")
    ratio = e2e["per_s"] / empty["per_s"]
    e2e["empty_store_per_s"] = empty["per_s"]
    e2e["of_raw_kafka"] = e2e["per_s"] / limit
    rss = max(p["rss_mb"], e2e["rss_mb"])
    ok = p["p99_ms"] < 50 and p["early"] == 0 and rss < 200
    return [
        Result(
            f"4 {size['pending']:,} pending",
            f"p99 {p['p99_ms']} ms late, {rss:.0f} MB RSS",
            "RSS < 200 MB, (3) holds",
            ok,
            _round(p),
        ),
        Result(
            f"4 e2e, {size['pending']:,} pending",
            f"{ratio:.2f}x of an empty store",
            ">= 0.85x of it",
            ratio >= 0.85,
            _round(e2e),
        ),
    ]


def _spark(bootstrap: str, n: int) -> list[Result]:
    try:
        from bench import spark_bench
    except ImportError as exc:  # the Spark benchmark needs the spark extra
        print(f"spark benchmark skipped: {exc}")
        return []
    return spark_bench.run(bootstrap, n)


def _ceiling(name: str, figures: dict[str, Any], limit: float, note: str) -> Result:
    ratio = f"{figures['per_s'] / limit:.2f}x of raw Kafka"
    return Result(f"2 ceiling: {name}", ratio, f"- ({note})", None, _round(figures))


def _best_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of these runs (by messages per second), with how many there were and
    every run's figure."""
    best = max(runs, key=lambda figures: float(figures["per_s"]))
    return {**best, "rounds": len(runs), "each_per_s": [round(r["per_s"]) for r in runs]}


def _round(figures: dict[str, Any]) -> dict[str, Any]:
    """Floats to a tenth, but ratios and small figures to three decimals."""
    return {
        k: (round(v, 1 if abs(v) >= 10 else 3) if isinstance(v, float) else v)
        for k, v in figures.items()
    }


def _share(bootstrap: str, n: int, rounds: int) -> list[Result]:
    """Benchmark 5's share-group rows (:mod:`bench.share`)."""
    s = share.run(bootstrap, n, rounds)
    print(f"share group: {s}")
    ratio = s["redrive 1"] / s["bare"]
    results = [
        Result(
            "5 consumer share group",
            f"{ratio:.2f}x of a bare ShareConsumer loop (json handler)",
            ">= 0.80x",
            ratio >= 0.8,
            {"n": n, "per_s": round(s["redrive 1"]), "bare_per_s": round(s["bare"])},
        )
    ]
    for count in share.CONSUMERS[1:]:
        per_s = s[f"redrive {count}"]
        results.append(
            Result(
                f"5 consumer share group, {count} consumers",
                f"{per_s / s['redrive 1']:.2f}x of one consumer, on one partition",
                "-",
                None,
                {"n": n, "per_s": round(per_s), "one_per_s": round(s["redrive 1"])},
            )
        )
    return results


if __name__ == "__main__":
    main()
