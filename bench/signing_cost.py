"""What checking a signature costs, alone, on benchmark 2's own requests: the whole
check, and the floor any verifier of this format pays (the value's SHA-256, the HMAC
over an encoding of the same length, and the signature header read off and dropped).

Measured in the run that measures the service, so the ceiling it gives (the most a
signed run can reach where the service's CPU bounds it) meets the same machine.
"""

from __future__ import annotations

import hashlib
import time

from bench.service import BENCH_KEYS, PAYLOAD, _requests
from redrive.signing import canonical, without_signature

REQUESTS = 2_000
ROUNDS = 30


def _best_us(work: object, rounds: int = ROUNDS) -> float:
    """The best round's microseconds per request of ``work()`` over :data:`REQUESTS`."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        work()  # type: ignore[operator]
        best = min(best, time.perf_counter() - started)
    return best / REQUESTS * 1e6


def check_costs() -> dict[str, float]:
    """Microseconds per request: ``check_us`` (reading the signature header and
    verifying it, as the service does) and ``floor_us`` (the part no verifier of
    this format can skip)."""
    signed = _requests("bench-dest", REQUESTS, [0] * REQUESTS, BENCH_KEYS)
    signing_key = BENCH_KEYS.current
    encoded_length = len(canonical(signed[0][1][:-1], signed[0][0], PAYLOAD))
    encoded = b"e" * encoded_length

    def check() -> None:
        # As the service does: the signature decoded with the other headers (not
        # counted here), verified over the headers as read, then dropped.
        for key, headers in signed:
            signature = headers[-1][1].decode("ascii")
            BENCH_KEYS.verify(headers, key, PAYLOAD, signature)
            without_signature(headers)

    def floor() -> None:
        for _key, headers in signed:
            without_signature(headers)
            hashlib.sha256(PAYLOAD).digest()
            signing_key.mac(encoded)

    return {"check_us": _best_us(check), "floor_us": _best_us(floor)}


def ceiling(unsigned_cpu_us: float, signed_cpu_us: float, costs: dict[str, float]) -> float:
    """The best ratio a signed run can reach where the service's CPU bounds it: its
    unsigned CPU per request plus the floor, the floor scaled as the whole check's
    cost was in the service in this run (signed minus unsigned CPU per request, over
    the check alone; at least 1)."""
    in_service = max(1.0, (signed_cpu_us - unsigned_cpu_us) / costs["check_us"])
    return unsigned_cpu_us / (unsigned_cpu_us + costs["floor_us"] * in_service)
