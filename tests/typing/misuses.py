"""Handler registrations a type checker must refuse: each line marked ``# refused:``
marks the call on the line after it: a combination of strategy options that means
nothing, which mypy rejects before anything runs (tests/unit/test_strategy_types.py
runs mypy on this file, and each call without it).

Not imported by anything: registering these would raise at run time too.
"""

from __future__ import annotations

from redrive import (
    App,
    Blocking,
    Breaker,
    Message,
    Pause,
    RefuseAndCount,
    RetryTopic,
    Service,
    Topics,
)


def handle(message: Message) -> None:
    pass


def handle_batch(messages: list[Message]) -> None:
    pass


app = App("localhost:9092", group="billing")
breaker = Breaker(failures=3)

# refused: breaker with blocking
app.add_handler("a", handle, strategy=Blocking(breaker=breaker))

# refused: breaker with topics
app.add_handler("b", handle, strategy=Topics(breaker=breaker))

# refused: breaker with retry-topic
app.add_handler("c", handle, strategy=RetryTopic(breaker=breaker))

# refused: breaker with service
app.add_handler("d", handle, strategy=Service(breaker=breaker))

# refused: breaker beside the strategy
app.add_handler("e", handle, strategy="pause", breaker=breaker)

# refused: per-group topic with blocking
app.add_handler("f", handle, strategy=Blocking(per_group_topic=True))

# refused: per-group topic with pause
app.add_handler("g", handle, strategy=Pause(per_group_topic=True))

# refused: per-group topic with topics
app.add_handler("h", handle, strategy=Topics(per_group_topic=True))

# refused: per-group topic with retry-topic
app.add_handler("i", handle, strategy=RetryTopic(per_group_topic=True))

# refused: key order with blocking
app.add_handler("j", handle, strategy=Blocking(ordering="key"))

# refused: key order with pause
app.add_handler("k", handle, strategy=Pause(ordering="key"))

# refused: an ordering that is none
app.add_handler("l", handle, strategy=Service(ordering="partition"))

# refused: a strategy that is none
app.add_handler("m", handle, strategy="retry")

# refused: a batch handler retrying in place
app.add_batch_handler("n", handle_batch, strategy=Blocking())

# refused: a batch handler retrying in place, by name
app.add_batch_handler("o", handle_batch, strategy="pause")

# refused: a breaker that is none
app.add_handler("p", handle, strategy=Pause(breaker=5))

# refused: a rule for refused returns that is none
App("localhost:9092", group="billing", returns="dead-letter")

# refused: a rollout option that is not True or False
App("localhost:9092", group="billing", returns=RefuseAndCount(trust_unsigned="yes"))
