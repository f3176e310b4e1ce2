"""Repeat deliveries: the ``redrive-id`` of redelivered records the App has handled.

A retry request is named by its ``redrive-id``, the same on every delivery of it
(:func:`redrive.headers.request_id`: derived from the failure, so a hand-off repeated
after a crash carries it too). A redelivered record whose id the App handled already
is a repeat: the retry service delivered it twice (a crash between its delivery and
its bookkeeping), or the failure was handed off twice. The App skips it, counted as
``redrive_consumer_records_total{outcome="repeat_skipped"}``, instead of handling it
again.

Invariant: the ids of the last ``size`` redelivered records handled by this App
instance are kept, and no others; a repeat older than that, or arriving at another
instance or after a restart, is handled again (at least once, as without the window).
Only handled records are remembered: a delivery that failed was not dealt with by its
handler, and its next delivery is a new request with its own id anyway.
"""

from __future__ import annotations

DEFAULT_REPEAT_WINDOW = 100_000
"""Ids remembered by default: about 10 MB, hours of redeliveries for most apps."""


class RecentIds:
    def __init__(self, size: int = DEFAULT_REPEAT_WINDOW) -> None:
        self.size = size
        self._ids: dict[str, None] = {}  # insertion order: the oldest first

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, request_id: str) -> None:
        ids = self._ids
        if request_id in ids or self.size <= 0:
            return
        ids[request_id] = None
        if len(ids) > self.size:
            del ids[next(iter(ids))]  # the oldest goes
