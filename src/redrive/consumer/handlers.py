"""What a handler may be: a plain function (or callable) that returns when done.

The loop calls handlers synchronously and counts a record as handled as soon as its
handler returns. An ``async def`` handler would return a coroutine without running
its body, and every record would be committed as handled: such handlers are refused
at registration, and a handler that returns an awaitable anyway (a plain function
wrapping an async one) fails its record instead of counting it as handled.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from redrive.errors import ConfigError


class AsyncHandlerError(TypeError):
    """A handler returned an awaitable (a coroutine): redrive does not run it, so the
    record failed. The policy decides what follows, as for any other failure."""


# Dead letters name it by the public name users import and search for.
AsyncHandlerError.__module__ = "redrive.consumer"

_FIX = (
    "use a plain def handler; to call async code from it, run it to completion there "
    "(asyncio.run, or asyncio.run_coroutine_threadsafe(...).result() on a loop of yours)"
)


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
    if is_async_callable(fn):
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        raise ConfigError(
            f"handler for {topic!r}",
            f"{name} is async (async def); async handlers are not supported yet",
            _FIX,
        )


def refuse_awaitable(result: Any) -> AsyncHandlerError:
    """The error for a handler that returned ``result``, an awaitable: closed first, so
    that a coroutine's body never runs and Python does not warn that it was never
    awaited."""
    if inspect.iscoroutine(result) or inspect.isgenerator(result):
        result.close()  # never started: none of its code runs
    return AsyncHandlerError(
        f"the handler returned {type(result).__qualname__}, an awaitable, which redrive "
        f"does not await: async handlers are not supported yet ({_FIX})"
    )
