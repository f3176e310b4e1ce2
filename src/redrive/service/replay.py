"""Replaying dead letters: back to their topic (or another allowed one), paced.

A replayed message carries the dead letter's key, value and the user's own headers;
the redrive headers are dropped, so consumers see a fresh message with a fresh
attempt count, but for two: ``redrive-replays`` (the letter's replays + 1) and
``redrive-replay-of`` (the letter's id), which redrive's senders carry through the
copy's retries into its next dead letter, so that the service counts the rounds of
a letter that keeps coming back (its loop guard, :mod:`.replay_guard`). The
destination must pass the same allowlist as retry requests and exist: an operator
cannot use replay to write where a request could not. A message counts only once
the broker acknowledged it. Bulk replays run as paced background jobs
(:mod:`redrive.service.replay_jobs`) that build their messages the same way.

Where a replay lands: back on the partition the letter was read from, when it goes
to the topic it was read from and that topic still has that partition, so that it
rejoins its key's records, wherever they were placed and by whichever producer;
anywhere else by its key, as the service's producers place every record
(:mod:`redrive.partitioners`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaError, Message, Producer

from redrive.headers import REPLAY_OF, REPLAYS, Header, is_redrive_header
from redrive.kafka import produce_patiently
from redrive.service.store import DeadLetter


class ReplayRefused(ValueError):
    """A replay that must not happen (destination not allowed, unknown); nothing was sent."""


@dataclass(frozen=True, slots=True)
class Edit:
    """What an operator changed before replaying one dead letter."""

    value: bytes | None = None
    headers: list[Header] | None = None


def replay_headers(letter: DeadLetter) -> list[Header]:
    """The two redrive headers a replay of the letter carries: its round, its letter."""
    return [
        (REPLAYS, str(letter.replays + 1).encode()),
        (REPLAY_OF, str(letter.id).encode()),
    ]


def replayed_message(
    letter: DeadLetter, edit: Edit | None = None
) -> tuple[bytes | None, list[Header]]:
    """The value and headers a dead letter is replayed with (its key is unchanged):
    the user's headers only, edited if asked, then its round's (:func:`replay_headers`)."""
    headers = [(k, v) for k, v in letter.headers if not is_redrive_header(k)]
    value = letter.msg_value
    if edit is not None:
        value = edit.value if edit.value is not None else value
        if edit.headers is not None:
            # Edited headers cannot forge redrive metadata either.
            headers = [(k, v) for k, v in edit.headers if not is_redrive_header(k)]
    return value, [*headers, *replay_headers(letter)]


@dataclass(frozen=True, slots=True)
class Target:
    """Where one letter is replayed: ``topic``, at ``partition`` (None: by its key)."""

    topic: str
    partition: int | None


def original_partition(letter: DeadLetter, topic: str, partitions: int) -> int | None:
    """The partition the letter was read from, if it is replayed to the topic it was
    read from and that topic (of ``partitions`` now) still has it; else None."""
    partition = letter.original_partition
    if partition is None or topic != letter.original_topic:
        return None
    return partition if 0 <= partition < partitions else None


class Replayer:
    def __init__(
        self,
        producer: Producer,
        destination_allowed: Callable[[str], bool],
        partitions_of: Callable[[str], int | None],
    ) -> None:
        self._producer = producer
        self._allowed = destination_allowed
        self._partitions_of = partitions_of

    def target_of(self, letter: DeadLetter, override: str | None) -> Target:
        """Where the letter goes (``override``, else its topic), checked; refused with
        ReplayRefused if it may not go there."""
        destination = override or letter.topic or letter.original_topic
        if not destination:
            raise ReplayRefused(f"dead letter {letter.id} has no topic; name a destination")
        if not self._allowed(destination):
            raise ReplayRefused(f"destination not allowed: {destination!r} is not in the allowlist")
        partitions = self._partitions_of(destination)
        if partitions is None:
            raise ReplayRefused(f"destination topic {destination!r} does not exist")
        return Target(destination, original_partition(letter, destination, partitions))

    def replay(
        self, letter: DeadLetter, *, destination: str | None = None, edit: Edit | None = None
    ) -> Target | None:
        """Send one dead letter (bulk replays are jobs: :mod:`.replay_jobs`); where it
        went once the broker acknowledged it, else None. Checks the destination first."""
        target = self.target_of(letter, destination)
        value, headers = replayed_message(letter, edit)
        acked: list[bool] = []

        def done(err: KafkaError | None, msg: Message) -> None:
            acked.append(err is None)  # a refused message is left out: its letter stays

        produce_patiently(
            self._producer,
            target.topic,
            key=letter.msg_key,
            value=value,
            headers=headers,
            on_delivery=done,
            partition=target.partition,
        )
        self._producer.flush(30)
        return target if acked == [True] else None
