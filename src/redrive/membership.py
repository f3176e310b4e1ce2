"""Membership of a consumer group: static, and loud when it is lost for good.

Used by the retry service's intake and by `redrive.App` alike.

Static membership (`group.instance.id`, KIP-345) is what lets a restarted instance take
its partitions back at once: the broker recognises the id and hands the new process the
killed one's assignment, where a new dynamic member would wait until the broker gives
up on the old one (`session.timeout.ms`, 45 s by default). Measured on the local
broker (Kafka 4.3, librdkafka 2.16): a SIGKILLed consumer restarted at once had its 6
partitions back after 0.1 s with a static id; without one, 45 s after each kill. The
KIP-848 protocol (`group.protocol=consumer`) does not help: a dynamic member waited
45.1 s, and a static one is refused (UNRELEASED_INSTANCE_ID) until the old session
expires.

Two live processes with one id cannot both be members: the broker fences the older
one, and librdkafka reports it only as an error message from poll (a fatal error,
after which the consumer is unusable). A loop that logs message errors and polls on
would idle forever; `GroupConsumer` (or a loop calling `fatal_group_error` on a
message's error) raises instead, naming the setting.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message

from redrive.errors import ConfigError


def static_membership(instance_id: str | None) -> dict[str, str]:
    """The consumer settings for static membership with this id (none if it is off)."""
    return {"group.instance.id": instance_id} if instance_id else {}


class GroupConsumer(Consumer):
    """A consumer whose fatal errors are raised from poll and consume, not returned.
    ``setting`` names where its instance id comes from, for the error."""

    def __init__(self, config: dict[str, Any], setting: str) -> None:
        super().__init__(config)
        self._group = str(config.get("group.id"))
        self._instance_id = config.get("group.instance.id")
        self._setting = setting

    def poll(self, timeout: float = -1) -> Message | None:
        msg = super().poll(timeout)
        if msg is not None:
            self._raise_if_fatal(msg)
        return msg

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        messages = super().consume(num_messages, timeout)
        for msg in messages:
            self._raise_if_fatal(msg)
        return messages

    def _raise_if_fatal(self, msg: Message) -> None:
        error = msg.error()
        if error is not None and error.code() == KafkaError._FATAL:
            raise fatal_group_error(error, self._group, self._instance_id, self._setting)


def fatal_group_error(
    error: KafkaError, group: str, instance_id: str | None, setting: str
) -> Exception:
    """What to raise for a fatal consumer error: with a static id, a ConfigError naming
    the setting (the id is taken, or still held); otherwise the error itself."""
    if not instance_id:
        return KafkaException(error)
    reason = error.str()
    if "still used" in reason:  # UNRELEASED_INSTANCE_ID, group.protocol=consumer only
        problem = (
            f"consumer group {group!r} still has a member with instance id "
            f"{instance_id!r} (another instance, or this one's killed process): {reason}"
        )
        fix = (
            "with group.protocol=consumer a restarted instance must wait for its old "
            "session to expire; leave group.protocol unset (classic), which takes the "
            "id over at once"
        )
    else:  # FENCED_INSTANCE_ID: another live process joined with this id
        problem = (
            f"another instance joined consumer group {group!r} with the same instance id "
            f"{instance_id!r}, and the broker fenced this one out: {reason}"
        )
        fix = (
            f"give each instance its own id ({setting}); two running instances may never share one"
        )
    return ConfigError(setting, problem, fix)
