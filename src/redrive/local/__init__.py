"""The real local stack: Apache Kafka in KRaft mode and an embedded PostgreSQL."""

from redrive.local.stack import LocalStack, StackPorts, StackStatus

__all__ = ["LocalStack", "StackPorts", "StackStatus"]
