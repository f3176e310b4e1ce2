"""Intake's copy of each stored dead letter to the DLQ topic (``mirror_dead_letters``).

The letters are durable in the store before they are copied, so a copy the broker
refuses is logged and counted, never a reason to stop intake (which would meet the
same request again at every restart). A letter refused with its whole batch is sent
again alone: only one refused alone has failed. A letter ingested from a dead-letter
topic is not copied: it is in one already.
"""

from __future__ import annotations

from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from redrive.headers import DEAD_LETTER_REASON
from redrive.kafka import BATCH_WIDE_REFUSALS, produce_patiently
from redrive.records import DeadLetterRecord
from redrive.service.metrics import ServiceMetrics

log = structlog.get_logger("redrive.intake")


def ingested(letter: DeadLetterRecord) -> bool:
    """Read from a dead-letter topic intake ingests, not refused as a request."""
    return letter.source.startswith("ingest:")


class DlqMirror:
    """Copies stored dead letters to ``dlq_topic`` with their reason as a header."""

    def __init__(self, config: dict[str, Any], dlq_topic: str, metrics: ServiceMetrics) -> None:
        # The service's producer settings: a dead letter near the requests topic's
        # size limit must not be refused by librdkafka's smaller default.
        self.producer = Producer({**config, "enable.idempotence": True})
        self.dlq_topic = dlq_topic
        self.metrics = metrics

    def copy(self, dead: list[DeadLetterRecord]) -> None:
        """Copy the letters not ingested, waiting for the broker's answer."""
        dead = [letter for letter in dead if not ingested(letter)]
        if not dead:
            return
        for letter, error in self._send(dead):
            if error.code() in BATCH_WIDE_REFUSALS:
                again = self._send([letter])
                if not again:
                    continue
                error = again[0][1]
            self._failed(letter, error.str())

    def close(self) -> None:
        self.producer.flush(10)
        self.producer.close()

    def _send(self, dead: list[DeadLetterRecord]) -> list[tuple[DeadLetterRecord, KafkaError]]:
        """Produce the letters and wait for the broker; those it refused, with why."""
        refused: list[tuple[DeadLetterRecord, KafkaError]] = []
        for letter in dead:
            headers = [*letter.headers, (DEAD_LETTER_REASON, letter.reason.encode())]

            def delivered(
                err: KafkaError | None, _: Message, letter: DeadLetterRecord = letter
            ) -> None:
                if err is not None:
                    refused.append((letter, err))

            try:
                produce_patiently(
                    self.producer,
                    self.dlq_topic,
                    key=letter.key,
                    value=letter.value,
                    headers=headers,
                    on_delivery=delivered,
                )
            except KafkaException as exc:  # refused before sending (too large, ...)
                refused.append((letter, exc.args[0]))
        self.producer.flush(30)
        return refused

    def _failed(self, letter: DeadLetterRecord, error: str) -> None:
        self.metrics.delivery_errors.labels("mirror_refused").inc()
        request = letter.request
        log.error(
            "dead letter stored but not mirrored to the DLQ topic",
            dlq_topic=self.dlq_topic,
            topic=request.topic if request else None,
            partition=request.partition if request else None,
            offset=request.offset if request else None,
            error=error,
        )
