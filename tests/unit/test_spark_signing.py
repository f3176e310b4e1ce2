"""The Spark pipeline's requests signed in the executors (RecordHandler, no Spark): what
goes to the requests topic carries a signature the service's keys verify; what goes
elsewhere is not signed; the keys survive the trip to an executor (pickled)."""

from __future__ import annotations

import base64
import pickle

import pytest

from redrive.headers import SIGNATURE, decode
from redrive.policy import policy
from redrive.router import SourceRecord
from redrive.signing import KeyRing, SignatureCheck, Verdict
from redrive.spark.pipeline_checks import signing
from redrive.spark.pipeline_settings import PipelineSettings
from redrive.spark.record_handler import Destinations, RecordHandler

pytestmark = pytest.mark.unit

KEYS = KeyRing.from_settings([f"spark={base64.b64encode(b'k' * 32).decode()}"])


def failing(key: bytes | None, value: bytes | None, headers: object, attempt: int) -> bytes:
    raise TimeoutError("slow")


def test_requests_to_the_service_are_signed_and_verify() -> None:
    for dead_letters, fatal in (("service", False), ("service", True), ("topic", True)):
        destinations = Destinations("out", "g", "reqs", dead_letters=dead_letters)  # type: ignore[arg-type]
        run = RecordHandler(
            failing,
            policy("1s x3", fatal_on=TimeoutError if fatal else ()),
            destinations,
            signing=KEYS,
        )
        run = pickle.loads(pickle.dumps(run))  # as an executor gets it
        out = run(SourceRecord("orders", 0, 7, 1_000, b"k", b"v", []))
        assert out is not None
        request, _ = decode(out.headers)
        if out.topic == "reqs":
            assert request.signature is not None
            found = KEYS.verify(out.headers, b"k", b"v", request.signature)
            assert found.verdict is Verdict.VALID
            assert (
                SignatureCheck(KEYS, required=True).refusal(
                    out.headers, b"k", b"v", request.signature
                )
                is None
            )
        else:  # a DLQ topic: no one checks it
            assert out.topic == "orders.dlq" and SIGNATURE not in dict(out.headers)


def test_the_command_takes_keys_from_its_options_or_the_environment() -> None:
    secret = base64.b64encode(b"c" * 32).decode()
    given = PipelineSettings("m:h", ("a",), "b", "g", "1s", "/tmp/c", signing_keys=(f"c={secret}",))
    ring = signing(given, {})
    assert ring is not None and ring.ids == ("c",)
    plain = PipelineSettings("m:h", ("a",), "b", "g", "1s", "/tmp/c")
    assert signing(plain, {}) is None
    env = {"REDRIVE_SIGNING_KEYS": f'["e={secret}"]'}
    from_env = signing(plain, env)
    assert from_env is not None and from_env.ids == ("e",)


def test_the_scheduler_ships_the_services_signature_check_to_its_executors() -> None:
    from redrive.service.config import ServiceSettings
    from redrive.spark.scheduler_rules import SchedulerRules

    key = f"spark={base64.b64encode(b'k' * 32).decode()}"
    settings = ServiceSettings(require_signatures=True, signing_keys=[key])
    rules = SchedulerRules.checked(
        requests_topic="reqs",
        dlq_topic="dlq",
        allowed_destinations=["*"],
        max_delay_days=1,
        admin_config={},
        signatures=settings.signature_check(),
    )
    shipped = pickle.loads(pickle.dumps(rules))
    assert shipped.signatures == SignatureCheck(KEYS, required=True)
    assert shipped.signatures.refusal([], b"k", b"v", None) == "the request is not signed"
