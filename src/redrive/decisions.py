"""What a policy answers: a :class:`Retry` (when) or a :class:`DeadLetter` (why).

Plain values, no logic of their own, so that everything that acts on a decision (the
failure router, the strategies, the Spark pipeline, tests) can hold one without the
policy that made it. :class:`Verdict` and :func:`cause_chain` are the vocabulary of
error classification: how an error was judged, and the exceptions it is judged along.
:class:`redrive.policy.Policy` makes all of them; users import them from
:mod:`redrive.policy`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeAlias

from redrive.reasons import DeadLetterReason


@dataclass(frozen=True, slots=True)
class Retry:
    """Bring the message back at ``at_ms`` (epoch ms), ``delay_ms`` after the failure.

    ``attempt`` is the failed-attempt count to write in ``redrive-attempt`` and
    ``deadline_ms`` the deadline to write in ``redrive-deadline`` (None: no deadline).
    """

    at_ms: int
    delay_ms: int
    attempt: int
    deadline_ms: int | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Give up: ``reason`` for machines, ``text`` for people (``str()`` is the text)."""

    reason: DeadLetterReason
    text: str
    attempt: int

    def __str__(self) -> str:
        return self.text


Decision: TypeAlias = Retry | DeadLetter


@dataclass(frozen=True, slots=True)
class Verdict:
    """How an error was classified, and which rule on which exception decided it."""

    retryable: bool
    rule: str
    exception: BaseException | None


def cause_chain(error: BaseException) -> Iterator[BaseException]:
    """The error, then what caused it, as Python's tracebacks show them.

    Follows ``__cause__`` (``raise ... from``), else ``__context__`` unless suppressed
    (``raise ... from None``); stops on cycles.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        if current.__cause__ is not None:
            current = current.__cause__
        elif current.__suppress_context__:
            current = None
        else:
            current = current.__context__
