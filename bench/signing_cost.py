"""What checking a signature costs, alone, on benchmark 2's own requests: the whole
check, and the floor any verifier of this format pays (the value's SHA-256 and the
HMAC over an encoding of the same length); and each check of a request's identity and
of a return: the content an accepted identity keeps (``requests.content_of``), a
sender's sealed id (``KeyRing.sealed_id``), and what a reader asks of a record that
comes back to it (``returns.ReturnCheck.doubt``, with keys and without).

Measured in the run that measures the service, so the ceiling it gives (the most a
signed run can reach where the service's CPU bounds it) meets the same machine.
"""

from __future__ import annotations

import hashlib
import time

from bench.service import BENCH_KEYS, PAYLOAD, _requests
from redrive.headers import read_delivery_headers
from redrive.requests import content_of
from redrive.returns import ReturnCheck
from redrive.signing import canonical

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
    """Microseconds per request: ``check_us`` (verifying the signature, as the service
        does), ``floor_us`` (the part no verifier of this format can skip), ``content_us``
        (the content intake keeps with each identity; ``content_signed_us`` with the value's
    digest shared with the signature check), ``sealed_id_us`` (a sender sealing
        an id), ``return_check_us`` and ``return_check_unkeyed_us`` (a reader's check of a
        return, with keys and without)."""
    signed = _requests("bench-dest", REQUESTS, [0] * REQUESTS, BENCH_KEYS)
    signing_key = BENCH_KEYS.current
    encoded_length = len(canonical(signed[0][1][:-1], signed[0][0], PAYLOAD))
    encoded = b"e" * encoded_length
    deliveries = [(key, headers, read_delivery_headers(headers)) for key, headers in signed]
    ids = [f"{i:032x}" for i in range(REQUESTS)]
    keyed, unkeyed = ReturnCheck(BENCH_KEYS), ReturnCheck()

    def check() -> None:
        # As the service does: the signature decoded with the other headers (not
        # counted here), verified over the headers as read.
        for key, headers in signed:
            signature = headers[-1][1].decode("ascii")
            BENCH_KEYS.verify(headers, key, PAYLOAD, signature)

    def floor() -> None:
        for _key, _headers in signed:
            hashlib.sha256(PAYLOAD).digest()
            signing_key.mac(encoded)

    def content() -> None:
        for key, _headers in signed:
            content_of(key, PAYLOAD, vouched=False)

    digest = hashlib.sha256(PAYLOAD).digest()

    def content_signed() -> None:
        # Intake hashes the value once, for the signature and the content.
        for key, _headers in signed:
            content_of(key, PAYLOAD, vouched=True, value_digest=digest)

    def sealed() -> None:
        for plain in ids:
            BENCH_KEYS.sealed_id(plain)

    def returns(check: ReturnCheck) -> None:
        for key, headers, delivery in deliveries:
            assert delivery is not None
            check.doubt(headers, key, PAYLOAD, delivery, ("bench-dest", 0), "bench-dest")

    return {
        "check_us": _best_us(check),
        "floor_us": _best_us(floor),
        "content_us": _best_us(content),
        "content_signed_us": _best_us(content_signed),
        "sealed_id_us": _best_us(sealed),
        "return_check_us": _best_us(lambda: returns(keyed)),
        "return_check_unkeyed_us": _best_us(lambda: returns(unkeyed)),
    }


def ceiling(unsigned_cpu_us: float, signed_cpu_us: float, costs: dict[str, float]) -> float:
    """The best ratio a signed run can reach where the service's CPU bounds it: its
    unsigned CPU per request plus the floor, the floor scaled as the whole check's
    cost was in the service in this run (signed minus unsigned CPU per request, over
    the check alone; at least 1)."""
    in_service = max(1.0, (signed_cpu_us - unsigned_cpu_us) / costs["check_us"])
    return unsigned_cpu_us / (unsigned_cpu_us + costs["floor_us"] * in_service)
