"""The example of docs/share-groups.md builds the share app it describes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from redrive import ShareApp, policy

DOC = Path(__file__).resolve().parents[2] / "docs" / "share-groups.md"

pytestmark = pytest.mark.unit


def test_the_share_groups_example_registers_its_handler() -> None:
    [block] = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    namespace: dict[str, object] = {}
    exec(compile(block, str(DOC), "exec"), namespace)
    app = namespace["app"]
    assert isinstance(app, ShareApp)
    route = app.routes["orders"]
    assert route.policy == policy("0s, 1s, 10s, 1m")
    assert route.redelivery_topic == "billing-workers.orders.retry"
    assert route.dead_letters == "service"
    assert app.metrics_port == 9464
