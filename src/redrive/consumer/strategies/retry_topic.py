"""``retry-topic``: non-blocking, Kafka only, through ONE retry topic.

A failed record is written to ``<group>.<topic>.retry.all`` (``billing.orders.retry.all``)
whatever its delay, on the partition it came from; the App reads that topic too. It is
the ``topics`` strategy with a single tier, the policy's longest delay.

The topic is per consumer group, as the tiers are, so that another group reading
``<topic>`` never sees this group's retries. It is per source topic too: it has its
source's partition count, so a record keeps its partition and the App reads it with
the source's assignment; one topic's long waits never hold another topic's retries;
and ACLs and retention can be set per topic.

A record not due yet holds its partition of the retry topic (sought back and paused,
no sleep; the source topic keeps flowing) until it is, so records come back never
early. With a constant interval a partition's records are due in the order they were
written, and each comes back on time: the classic "retry every 10 s, for at most 5
minutes from the event" is ``policy="10s", max_duration="5m",
deadline_from="record-timestamp"``. With a schedule of varying delays (or jitter) a
record behind a later-due one comes back late: use ``topics`` then.

Unlike the usual single-retry-topic consumer, a due record is handled straight from
the retry topic rather than written back to the original topic: other groups never
see it, and it costs one write less. As with ``topics``, a record claiming to be due
later than the longest delay allows (forged or corrupt) is handled at once rather
than holding its partition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from redrive.consumer.strategies.base import RouteView
from redrive.consumer.strategies.topics import Topics, nominal_delays
from redrive.policy import Policy
from redrive.topic_names import single_retry_topic


@dataclass(frozen=True)
class RetryTopic(Topics):
    """Through one retry topic per topic and consumer group, whatever the delay;
    ``ordering="key"`` as :class:`Topics`'s."""

    name = "retry-topic"
    tier_pattern: ClassVar[str] = "<group>.<topic>.retry.all"

    def tier_topics(self, route: RouteView) -> dict[int, str]:
        # One tier, keyed by the longest delay: RouteView.tier_for maps every attempt to it
        # (its max(tiers) fallback), and Topics.hold bounds a wait by it.
        return {longest_delay(route.policy): single_retry_topic(route.group, route.topic)}


def longest_delay(policy: Policy) -> int:
    """The longest nominal delay (ms) a message can wait under this policy, however
    many distinct delays its schedule has (jitter only shortens them)."""
    return max(nominal_delays(policy), default=0)
