"""Share-group dead letters (KIP-1191, Kafka 4.4: a share group's
``errors.deadletterqueue.topic.name``).

The broker writes a record its share group rejected, or delivered too often, with
``__dlq.errors.topic/-partition/-offset`` (where it is, the topic by name, or by id
when the broker could not name it), ``__dlq.errors.group``, ``__dlq.errors.message``
(why: rejected by the client, or its delivery count exceeded) and
``__dlq.errors.delivery.count``, every value UTF-8 text, numbers in decimal. By
default (``errors.deadletterqueue.copy.record.enable=false``) the dead letter holds
only those headers, no key and no value: the record is read from its topic while the
topic retains it (:mod:`.originals`), and the letter says so when it no longer does.
With the copy on, the dead letter has the record's key and value (not its headers).
"""

from __future__ import annotations

from typing import Final

from redrive.header_fields import FailureHistory
from redrive.headers import MAX_ERROR_MESSAGE_BYTES, MAX_INT32, MAX_VALUE_BYTES, Header
from redrive.requests import Incoming
from redrive.service.ingest import reading as r
from redrive.service.ingest.dialect import Dialect, described

PREFIX: Final = "__dlq.errors."


def _read(meta: list[Header], incoming: Incoming) -> r.Fields:
    m = r.Meta(meta)
    group = m.get(f"{PREFIX}group", r.text(MAX_VALUE_BYTES))
    history = FailureHistory(
        group=group,
        **r.text_origin(m, PREFIX),
        error_message=m.get(f"{PREFIX}message", r.text(MAX_ERROR_MESSAGE_BYTES)),
    )
    deliveries = m.get(f"{PREFIX}delivery.count", r.decimal(MAX_INT32))
    context = [
        f"{label} {value}"
        for label, value in (("group", group and r.short(group)), ("deliveries", deliveries))
        if value is not None
    ]
    what = "Kafka share-group dead letter" if m else "record without __dlq.errors. headers"
    about = f" ({', '.join(context)})" if context else ""
    copied = incoming.key is not None or incoming.value is not None
    located = None not in (
        history.original_topic,
        history.original_partition,
        history.original_offset,
    )
    return described(
        m,
        incoming,
        what,
        history,
        about=about,
        attempt=deliveries or None,
        needs_record=located and not copied,
    )


DIALECT: Final = Dialect(
    name="share-group", is_metadata=r.has_prefix(PREFIX), marks=r.has_prefix(PREFIX), read=_read
)
