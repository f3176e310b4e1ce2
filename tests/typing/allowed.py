"""The same registrations written as they mean something: mypy accepts every line
(tests/unit/test_strategy_types.py), so the refusals in misuses.py are the
combinations', not the calls'."""

from __future__ import annotations

from redrive import (
    App,
    Blocking,
    Breaker,
    KeyRing,
    Message,
    Pause,
    RefuseAndCount,
    RefuseToDeadLetters,
    RetryTopic,
    Service,
    ShareApp,
    Topics,
)


def handle(message: Message) -> None:
    pass


def handle_batch(messages: list[Message]) -> None:
    pass


app = App("localhost:9092", group="billing", transactional=True)

app.add_handler("a", handle, strategy=Blocking())
app.add_handler("b", handle, strategy=Pause(breaker=Breaker(failures=3)))
app.add_handler("c", handle, strategy=Topics(ordering="key"))
app.add_handler("d", handle, strategy=RetryTopic(ordering="key"))
app.add_handler("e", handle, strategy=Service(per_group_topic=True))
app.add_handler("f", handle, strategy=Service(ordering="key"), policy="2s x5")
app.add_handler("g", handle, strategy="pause")
app.add_batch_handler("h", handle_batch, strategy=Topics())
app.add_batch_handler("i", handle_batch, strategy="service", max_records=100)

keys = KeyRing.from_settings(files=["/etc/redrive/signing-keys"])
App("localhost:9092", group="billing", signing=keys, returns=RefuseToDeadLetters())
App("localhost:9092", group="billing", signing=keys, returns=RefuseAndCount(trust_unsigned=True))
ShareApp("localhost:9092", group="billing", signing=keys, returns=RefuseAndCount())
