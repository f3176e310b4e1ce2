"""Structured logging: every event says what happened to which message.

Events carry fields (topic, partition, offset, destination, reason...) rather than
prose, rendered as JSON lines for machines or as readable key=value for a terminal.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

import structlog
from structlog.typing import EventDict


def configure(
    fmt: Literal["json", "console"] = "console",
    level: int = logging.INFO,
    fields: dict[str, Any] | None = None,
) -> None:
    """Log events as `fmt` from `level` up, each with `fields` too (a process's own,
    such as which worker of `redrive serve` it is)."""
    static = dict(fields or {})

    def add_fields(_: Any, __: str, event: EventDict) -> EventDict:
        return {**static, **event}

    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            *([add_fields] if static else []),
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
