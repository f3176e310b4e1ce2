"""Repeat deliveries: the ``redrive-id`` of redelivered records the App has handled.

A retry request is named by its ``redrive-id``, the same on every delivery of it
(:func:`redrive.headers.request_id`: derived from the failure, so a hand-off repeated
after a crash carries it too). A redelivered record whose id the App handled already
is a repeat: the retry service delivered it twice (a crash between its delivery and
its bookkeeping), or the failure was handed off twice. The App skips it, counted as
``redrive_consumer_records_total{outcome="repeat_skipped"}``, instead of handling it
again.

Invariant: the ids of the last ``size`` redelivered records this App instance dealt
with are kept, and no others; a repeat older than that, or arriving at another
instance or after a restart, is handled again (at least once, as without the window).
A record is dealt with once handled, or once its failure is handed off (its next
retry, or its dead letter) and that hand-off is committed: a repeat of a delivery
that failed would otherwise fail again and hand the same next retry off twice. With
``transactional=True`` such ids count from the commit of their transaction
(:meth:`RecentIds.stage`, :meth:`RecentIds.commit`): a repeat skipped after an
aborted hand-off would lose it.

Only deliveries the App believes (:mod:`redrive.consumer.refusals`) enter the window or
are looked up in it: a record whose redrive headers it cannot believe is never a
repeat, and never makes another one. An entry is the delivery's id bound to its
content (:meth:`RecentIds.entry`) wherever an unsigned delivery may be believed (an App
without keys, or one trusting unsigned returns while signing is rolled out): any
producer can copy a genuine id onto another value, and that record must not make the
App skip the genuine one. With keys, the signature binds the id to the record already.

A repeat of a record that left its key's queue (``ordering="key"``) releases the
queue again, since the first release may be lost (a crash before it was sent, or
its transaction aborted); with transactions, not once the transaction that released
it committed: the release is then as durable as the handling, and a second one
would be a second hand-off of the same request.
"""

from __future__ import annotations

import hashlib

from redrive.errors import ConfigError

DEFAULT_REPEAT_WINDOW = 100_000
"""Ids remembered by default: about 10 MB, hours of redeliveries for most apps."""
_CONTENT_BYTES = 8
"""The bytes of the digest of a delivery's key and value an entry carries: a record of
another key or value under the same id passes for it once in 2^64."""


def checked_window(size: object) -> int:
    """``App(repeat_window=...)`` as given, or a ConfigError naming it."""
    if type(size) is not int or size < 0:
        raise ConfigError(
            "App(repeat_window=...)",
            f"{size!r} is not a whole number >= 0",
            f"use the default {DEFAULT_REPEAT_WINDOW}, or 0 to handle repeats again",
        )
    return size


class RecentIds:
    def __init__(self, size: int = DEFAULT_REPEAT_WINDOW, binds_content: bool = True) -> None:
        self.size = size
        self.binds_content = binds_content
        """Entries name a delivery's content with its id (see the module)."""
        # id -> whether a repeat of it releases its key's queue again: its record left
        # the queue (handled or a dead letter) and the release may be lost (without
        # transactions, or in one not committed yet); not when it went on to its next
        # retry (it stays in the queue) or its transaction committed the release.
        self._ids: dict[str, bool] = {}  # insertion order: the oldest first
        self._staged: list[str] = []

    def entry(self, request_id: str, key: bytes | None, value: bytes | None) -> str:
        """What the window keeps of a delivery of ``request_id`` with this key and value:
        the id, followed by a digest of the key and value where it binds content."""
        if not self.binds_content:
            return request_id
        digest = hashlib.blake2b(digest_size=_CONTENT_BYTES)
        for part in (key, value):
            # Length-prefixed, an absent part apart from an empty one: no two records
            # of another key or value digest alike by their concatenation.
            if part is None:
                digest.update(b"-")
            else:
                digest.update(b"%d:" % len(part))
                digest.update(part)
        return f"{request_id}:{digest.hexdigest()}"

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def left_queue(self, request_id: str) -> bool:
        """Whether the record of a remembered id is done with (not retried)."""
        return self._ids.get(request_id, False)

    def add(self, request_id: str, done: bool = True) -> None:
        ids = self._ids
        if request_id in ids or self.size <= 0:
            return
        ids[request_id] = done
        if len(ids) > self.size:
            del ids[next(iter(ids))]  # the oldest goes

    def stage(self, request_id: str) -> None:
        """A delivery was dealt with in the open transaction (handled, or its failure
        handed off): once the transaction commits (:meth:`commit`) it is remembered as
        settled; if it aborts (:meth:`abort`), a hand-off is forgotten and a handled
        record stays as :meth:`add` left it."""
        if self.size > 0:
            self._staged.append(request_id)

    def commit(self) -> None:
        """The open transaction committed, with the key-queue releases it made: a
        repeat of its deliveries is skipped without releasing again (a second release
        would be a second hand-off of the same request)."""
        ids = self._ids
        for request_id in self._staged:
            if request_id in ids:
                ids[request_id] = False
            else:
                self.add(request_id, done=False)
        self._staged.clear()

    def abort(self) -> None:
        self._staged.clear()
