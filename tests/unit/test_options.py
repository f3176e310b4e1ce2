"""Keyword options gathered in TypedDicts still refuse a misspelt name at run time."""

from __future__ import annotations

import pytest

import redrive

pytestmark = pytest.mark.unit


def test_a_misspelt_handler_option_is_refused() -> None:
    app = redrive.App("127.0.0.1:1", group="g")
    with pytest.raises(TypeError, match="retry_onn"):
        app.add_handler("orders", lambda m: None, retry_onn=[KeyError])  # type: ignore[call-arg]
    app.add_handler("orders", lambda m: None, policy="1s", strategy="blocking")
    assert "orders" in app.routes


def test_a_misspelt_pipeline_option_is_refused() -> None:
    pytest.importorskip("pyspark")
    from redrive.spark.pipeline import with_retries

    with pytest.raises(TypeError, match="dlq_topc"):
        with_retries(None, lambda *a: None, policy="1s", output_topic="o", group="g", dlq_topc="x")  # type: ignore[call-arg]
