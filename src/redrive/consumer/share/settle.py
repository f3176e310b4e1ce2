"""How a record of a share group is settled: the acknowledgement its outcome becomes.

- handled (or dealt with before its handler: a repeat skipped, a dead letter for
  headers or a value that cannot be read): ACCEPT;
- failed, and the policy retries it at once: RELEASE, and the broker delivers it again
  (to any consumer of the group, its delivery count + 1), unless this was its last
  delivery before the group's limit: then it is handed off as a later retry is;
- failed, and retried later: handed off to the retry service (the requests topic),
  which delivers it when due to the route's topic or its per-group topic, and the
  record ACCEPTed. A RELEASE would come back at once, before it is due; keeping the
  record acquired until due would stop the consumer from polling (in explicit mode a
  poll needs every record of the last one acknowledged);
- failed, and the policy gives up (a fatal error, the policy spent): a dead letter
  with its key, value and reason, and the record REJECTed.

Neither lost nor twice: the acknowledgements of a poll's records reach the broker
only with the next poll (or the close), and the consumer flushes its hand-offs before
that; a consumer that dies in between has its records delivered again (delivery count
+ 1) and hands them off again with the same ``redrive-id``, which the retry service
stores once. That id names the record as read (:func:`share_failure_id`), not the
attempt: a record leaves a share group through one hand-off at most, whatever its
delivery count when it does.
"""

from __future__ import annotations

import dataclasses

from confluent_kafka import AcknowledgeType

from redrive.consumer.message import Message
from redrive.consumer.outcomes import Outcomes, safe_repr
from redrive.consumer.routes import Route
from redrive.headers import failure_request_id
from redrive.router import DeadLettered

ACCEPT = AcknowledgeType.ACCEPT
RELEASE = AcknowledgeType.RELEASE
REJECT = AcknowledgeType.REJECT


def share_failure_id(group: str, message: Message) -> str:
    """The ``redrive-id`` of a share group's hand-off of a record (see the module):
    attempt 0, which no consumer group's failure has (theirs count from 1)."""
    read_at = (message.topic, message.partition, message.offset)
    delivered_as = message.retry.id if message.retry is not None else None
    return failure_request_id(group, 0, read_at, delivered_as)


def last_delivery(message: Message, limit: int) -> bool:
    return (message.delivery_count or 1) >= limit


class Settler:
    """Settles the failures of one share app's records (see the module)."""

    def __init__(self, group: str, outcomes: Outcomes, delivery_limit: int) -> None:
        self.group = group
        self.outcomes = outcomes
        self.delivery_limit = delivery_limit

    def failed(self, route: Route, message: Message, error: BaseException) -> AcknowledgeType:
        outcomes = self.outcomes
        failure, outcome = outcomes.decide(route, message, error)
        share_id = share_failure_id(self.group, message)
        if isinstance(outcome, DeadLettered):
            headers = dataclasses.replace(outcome.headers, id=share_id)
            dead = dataclasses.replace(outcome, headers=headers)
            outcomes.dead_letter(route, failure, dead, message, error)
            outcomes.remember_handed_off(failure, done=True)
            return REJECT
        outcomes.metrics.records.labels(route.topic, "retried").inc()
        outcomes.call_hook(outcomes.hooks.on_retry, message, outcome.decision, error)
        if outcome.decision.delay_ms <= 0 and not last_delivery(message, self.delivery_limit):
            return RELEASE
        # A retry that is not in place has its request and where it goes.
        assert outcome.request is not None
        assert outcome.target is not None
        outcomes.publisher.send(
            outcome.target.topic,
            key=failure.key,
            value=failure.value,
            user_headers=failure.headers,
            redrive=dataclasses.replace(outcome.request, id=share_id),
            partition=outcome.target.partition,
        )
        outcomes.remember_handed_off(failure, done=False)
        return ACCEPT


__all__ = ["ACCEPT", "REJECT", "RELEASE", "Settler", "safe_repr", "share_failure_id"]
