"""The examples in examples/ run as documented."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.consumer_harness import retry_service, wait_for
from tests.integration.service_harness import dead_letters, produce

pytestmark = pytest.mark.integration
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def dead_letter_keys(database_url: str) -> list[bytes]:
    return [bytes(letter["msg_key"]) for letter in dead_letters(database_url)]


def test_consumer_quickstart_retries_and_dead_letters(bootstrap: str, database_url: str) -> None:
    with retry_service(bootstrap, database_url, allowed_destinations=["orders"]) as service:
        env = {
            **os.environ,
            "REDRIVE_BOOTSTRAP": bootstrap,
            "EXAMPLE_MAX_MESSAGES": "2",
            "REDRIVE_REQUESTS_TOPIC": service.settings.requests_topic,
        }
        proc = subprocess.Popen(
            [sys.executable, str(EXAMPLES / "consumer_quickstart.py")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        produce(
            bootstrap,
            "orders",
            [
                {"key": b"1", "value": json.dumps({"id": 1}).encode()},
                {"key": b"2", "value": json.dumps({"id": 2, "declined_until_attempt": 1}).encode()},
                {"key": b"3", "value": b"not json"},
            ],
        )
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        assert "order 1: attempt 1" in out
        assert "order 2: attempt 1" in out and "order 2: attempt 2" in out
        # The service stores the example's dead letter as its request comes in.
        wait_for(lambda: dead_letter_keys(service.database_url) == [b"3"], 30)
        assert dead_letter_keys(service.database_url) == [b"3"]
        letters = dead_letters(service.database_url)
        assert "deserialized" in letters[0]["reason"]
