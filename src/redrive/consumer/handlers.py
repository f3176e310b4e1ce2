"""What a handler may be: a plain function (or callable) that returns when done, or an
``async def`` one, which the App runs on its event loop
(:mod:`redrive.consumer.async_records`).

Which of the two a handler is, is decided once, at registration
(:func:`is_async_callable`). A plain function that returns an awaitable anyway (one
wrapping an async function) fails its record with :class:`AsyncHandlerError` instead
of counting it as handled: redrive does not await what a plain handler returns, so
its body never ran. An async generator function is refused: it cannot say when it is
done with a record.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from redrive.errors import ConfigError


class AsyncHandlerError(TypeError):
    """A plain (``def``) handler returned an awaitable (a coroutine): redrive does not
    run it, so the record failed. The policy decides what follows, as for any other
    failure."""


# Dead letters name it by the public name users import and search for.
AsyncHandlerError.__module__ = "redrive.consumer"

_FIX = "declare the handler itself async def: the App awaits it on its event loop"


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` returns a coroutine or async generator instead of running
    its body: an ``async def`` function or method, an object whose ``__call__`` is
    one, or a ``functools.partial`` of either."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        return True
    if inspect.isroutine(fn) or inspect.isclass(fn):
        return False  # calling it runs it (or builds an instance)
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - the class's, as call() uses
    return inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call)


def check_handler(topic: str, fn: object) -> None:
    """Refuse at registration what the loop cannot run: ConfigError with a fix."""
    if not callable(fn):
        raise ConfigError(f"handler for {topic!r}", f"{fn!r} is not callable")
    target: object = fn
    while isinstance(target, functools.partial):
        target = target.func
    call = target if inspect.isroutine(target) else getattr(type(target), "__call__", None)  # noqa: B004
    if inspect.isasyncgenfunction(target) or inspect.isasyncgenfunction(call):
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        raise ConfigError(
            f"handler for {topic!r}",
            f"{name} is an async generator function, which never says it is done",
            "use async def with return (or a plain def)",
        )


def refuse_awaitable(result: Any) -> AsyncHandlerError:
    """The error for a handler that returned ``result``, an awaitable: closed first, so
    that a coroutine's body never runs and Python does not warn that it was never
    awaited."""
    if inspect.iscoroutine(result) or inspect.isgenerator(result):
        result.close()  # never started: none of its code runs
    return AsyncHandlerError(
        f"the handler returned {type(result).__qualname__}, an awaitable, which redrive "
        f"does not await from a plain def handler ({_FIX})"
    )
