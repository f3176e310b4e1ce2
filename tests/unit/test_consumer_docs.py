"""The settings examples of docs/consumer.md run, and configure what they say."""

from __future__ import annotations

import re
import socket
from pathlib import Path

from redrive import App, Service, Topics

DOC = Path(__file__).resolve().parents[2] / "docs" / "consumer.md"


def examples() -> list[str]:
    """The python blocks that build an App without running it (those need a broker)."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    return [block for block in blocks if ".run(" not in block]


def test_the_settings_examples_configure_the_consumer() -> None:
    apps = []
    for block in examples():
        namespace: dict[str, object] = {"App": App}
        exec(compile(block, str(DOC), "exec"), namespace)
        apps.append(namespace["app"])
    [typed, unbacklogged, transactional, static, fetching] = apps
    assert isinstance(unbacklogged, App)
    assert unbacklogged.routes["order-status"].redelivery_topic == "shipping.order-status.retry"
    assert isinstance(typed, App)
    assert typed.routes["orders"].strategy == Service(per_group_topic=True)
    assert typed.routes["orders"].redelivery_topic == "billing.orders.retry"
    assert typed.routes["statuses"].strategy == Topics(ordering="key")
    assert typed.routes["statuses"].lines_in_tiers
    assert isinstance(transactional, App) and transactional.settings.transactional
    assert transactional.settings.consumer_kafka == {"group.instance.id": "billing-0"}
    assert isinstance(static, App) and isinstance(fetching, App)
    assert static.settings.consumer_kafka == {"group.instance.id": socket.gethostname()}
    assert fetching.settings.consumer_kafka["fetch.min.bytes"] == 1_048_576
    assert "group.instance.id" not in fetching.settings.consumer_kafka
