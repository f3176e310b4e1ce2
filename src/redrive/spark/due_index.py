"""Where a bucket of the Spark scheduler keeps its pending messages, and its one timer.

The scheduler groups requests by bucket (a hash of destination and key), so that the
Python work is per batch of requests, not per message key. A bucket may hold many
pending messages with many due times; reading all of them whenever one is due would
cost time in the size of the bucket. So the messages are filed by **slot**, their due
time in whole seconds (:data:`SLOT_MS`), one state value per slot, and this index
says which slots hold messages and the earliest due time in each. Each state call
is a round trip between the Python worker and the JVM, and that is what a batch
mostly costs: a slot is one value (read and written whole, a few calls per batch),
not one value per message or per batch that added to it.

Invariants (kept by every method):

- ``slots`` maps each occupied slot to the earliest due time of its messages, which
  lies inside the slot;
- ``timer`` is the one processing-time timer registered for the bucket, or None;
  after :meth:`arm` it is the earliest due time of all slots (None when empty), so
  a timer never fires before a message is due, and fires when the first one is.

Pure: no Spark, no clock (``now`` is passed in), so it is tested on its own.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Final

SLOT_MS: Final = 1_000
"""The width of a slot. One slot of one bucket is read whole when its first message is
due, so a slot should hold about one trigger interval's worth: a message is read at
most ``SLOT_MS / trigger`` times before it is delivered."""

_NO_TIMER: Final = -(2**63)  # no due time is this early


def slot_of(due_ms: int) -> int:
    """The slot a due time is filed under."""
    return due_ms // SLOT_MS


@dataclass
class TimerChange:
    """What to tell Spark so that the bucket's one timer is where the index says."""

    delete: int | None = None
    register: int | None = None


@dataclass
class DueIndex:
    """The occupied slots of one bucket, and its registered timer (see the module)."""

    slots: dict[int, int] = field(default_factory=dict)
    timer: int | None = None

    # ------------------------------------------------------------------ state value

    def to_bytes(self) -> bytes:
        """Packed int64s: the timer (_NO_TIMER for none), then (slot, earliest) for each slot."""
        values = array("q", [_NO_TIMER if self.timer is None else self.timer])
        for slot in sorted(self.slots):
            values.extend((slot, self.slots[slot]))
        return values.tobytes()

    @classmethod
    def from_bytes(cls, data: bytes | None) -> DueIndex:
        """The index :meth:`to_bytes` wrote; an empty index for None (a new bucket)."""
        if not data:
            return cls()
        values = array("q")
        values.frombytes(data)
        timer = None if values[0] == _NO_TIMER else values[0]
        slots = {values[i]: values[i + 1] for i in range(1, len(values), 2)}
        return cls(slots, timer)

    # -------------------------------------------------------------------- questions

    def __bool__(self) -> bool:
        return bool(self.slots)

    def earliest(self) -> int | None:
        """The earliest due time of any pending message, or None."""
        return min(self.slots.values(), default=None)

    def due_slots(self, now_ms: int) -> list[int]:
        """The slots holding a message due at ``now_ms``, earliest first."""
        return sorted(slot for slot, earliest in self.slots.items() if earliest <= now_ms)

    # ------------------------------------------------------------------- changes

    def file(self, slot: int, earliest_ms: int | None) -> None:
        """``slot`` now holds messages due from ``earliest_ms`` on, or none (None)."""
        if earliest_ms is None:
            self.slots.pop(slot, None)
            return
        if slot_of(earliest_ms) != slot:
            raise ValueError(f"due time {earliest_ms} is not in slot {slot}")
        self.slots[slot] = earliest_ms

    def fired(self, timer_ms: int) -> None:
        """Spark fired (and so forgot) the timer at ``timer_ms``."""
        if self.timer == timer_ms:
            self.timer = None

    def arm(self) -> TimerChange:
        """Move the bucket's one timer to the earliest due time; what to tell Spark."""
        wanted = self.earliest()
        if wanted == self.timer:
            return TimerChange()
        change = TimerChange(delete=self.timer, register=wanted)
        self.timer = wanted
        return change
