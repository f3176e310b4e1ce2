"""The real local stack: Apache Kafka in KRaft mode and an embedded PostgreSQL.

The dev stack only: production code does not import it. Its names load on first use,
so that importing one of its modules (`redrive.local.kafka`, say) needs none of the
others' dependencies. The jar cache it fetches the broker with is the core's
(`redrive.jars`), which Spark's connector jars share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redrive.local.stack import LocalStack, StackPorts, StackStatus

__all__ = ["LocalStack", "StackPorts", "StackStatus"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from redrive.local import stack

        return getattr(stack, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
