"""Importing the code a command line names: the handler (``MODULE:HANDLER``) and
exception classes (``orders.PaymentDeclined``, ``TimeoutError``).

``redrive spark pipeline`` checks these before it starts Spark, so that a typo costs
a one-line error naming the option and the fix, not a JVM start and a traceback. As
uvicorn does for ``MODULE:APP``, the current directory is searched first: a handler
in ``./orders.py`` is ``orders:charge`` wherever redrive is installed.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any, Final, cast

from redrive.errors import ConfigError
from redrive.spark.record_handler import Handler

HANDLER_SETTING: Final = "MODULE:HANDLER"
"""How errors about the handler argument name it (its metavar on the command line)."""

HANDLER_CALL: Final = "handler(key, value, headers, attempt)"


def import_handler(ref: str) -> Handler:
    """The function ``ref`` (``MODULE:HANDLER``) names, checked to be one the pipeline
    can call as ``handler(key, value, headers, attempt)``; raises :class:`ConfigError`."""
    module_name, attribute = _split(ref)
    module = _import_module(module_name, HANDLER_SETTING)
    handler = _attribute(module, attribute, HANDLER_SETTING)
    where = f"{module_name}:{attribute}"
    if isinstance(handler, type):
        raise ConfigError(
            HANDLER_SETTING,
            f"{where} is a class: the pipeline would call it as {HANDLER_CALL} and get "
            "an instance, not the bytes to write",
            f"name a function {HANDLER_CALL} defined in {module_name}",
        )
    if not callable(handler):
        raise ConfigError(
            HANDLER_SETTING,
            f"{where} is a {type(handler).__name__}, not a function",
            f"name a function {HANDLER_CALL} defined in {module_name}",
        )
    if _is_async(handler):
        raise ConfigError(
            HANDLER_SETTING,
            f"{where} is an async function: the Spark pipeline calls handlers "
            "synchronously on the executors, so it would get a coroutine and never run it",
            "make it a plain def (inside it, asyncio.run(...) can run async code)",
        )
    _check_signature(handler, where)
    return cast(Handler, handler)


def import_exception_classes(setting: str, names: Sequence[str]) -> list[type[BaseException]]:
    """The exception classes named by dotted names (``json.JSONDecodeError``,
    ``orders.PaymentDeclined``; a bare name is a builtin, ``TimeoutError``), as the
    ``redrive-error-type`` header names them. Raises :class:`ConfigError` naming
    ``setting``."""
    return [_exception_class(setting, name) for name in names]


def _split(ref: str) -> tuple[str, str]:
    module_name, colon, attribute = ref.partition(":")
    if not colon or not module_name or not attribute or ":" in attribute:
        raise ConfigError(
            HANDLER_SETTING,
            f"{ref!r} is not of the form MODULE:HANDLER",
            "e.g. orders:charge for the function charge in orders.py "
            "(or payments.handlers:charge in a package)",
        )
    return module_name, attribute


def _make_current_directory_importable() -> None:
    """As `python -m` and uvicorn do: a module in the current directory imports,
    also when redrive runs as an installed command (whose sys.path[0] is its bin/)."""
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.insert(0, here)


def _import_module(name: str, setting: str) -> ModuleType:
    module = _find_module(name, setting)
    if module is None:
        top = name.partition(".")[0]
        raise ConfigError(
            setting,
            f"no module named {name!r} (searched the current directory {os.getcwd()} "
            "and PYTHONPATH)",
            f"run from the folder that holds {top}.py (or the package {top}/), "
            "or add that folder to PYTHONPATH",
        )
    return module


def _find_module(name: str, setting: str) -> ModuleType | None:
    """Module ``name``, or None if there is none; raises :class:`ConfigError` if it
    exists but fails to import."""
    _make_current_directory_importable()
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if name == missing or name.startswith(missing + "."):
            return None
        raise ConfigError(
            setting,
            f"importing {name!r} failed: it imports {missing!r}, which is not installed",
            f"install it in this Python ({sys.executable}) and on the executors",
        ) from None
    except Exception as exc:  # noqa: BLE001 - whatever the user's module raises
        raise ConfigError(
            setting,
            f"importing {name!r} raised {type(exc).__name__}: {exc}",
            f"python -c 'import {name}' shows where",
        ) from None


def _attribute(module: ModuleType, path: str, setting: str) -> Any:
    found: Any = module
    for part in path.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            where = getattr(module, "__file__", None) or module.__name__
            raise ConfigError(
                setting,
                f"module {module.__name__!r} ({where}) has no attribute {path!r}",
                f"check the name (case matters); it defines {_defined_in(module)}",
            ) from None
    return found


def _defined_in(module: ModuleType, most: int = 12) -> str:
    """The functions and classes a module defines (not those it imports), for a hint."""
    names = [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and callable(value)
        and getattr(value, "__module__", None) == module.__name__
    ]
    if not names:
        return "no function or class"
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(sorted(names)[:most]) + more


def _is_async(handler: Any) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    call = getattr(type(handler), "__call__", None)  # noqa: B004 - its kind, not callable()
    for candidate in (handler, call):
        if inspect.iscoroutinefunction(candidate) or inspect.isasyncgenfunction(candidate):
            return True
    return False


def _check_signature(handler: Any, where: str) -> None:
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):  # some builtins have none: Spark will tell
        return
    try:
        signature.bind(None, None, [], 1)
    except TypeError:
        raise ConfigError(
            HANDLER_SETTING,
            f"{where}{signature} cannot be called as {HANDLER_CALL}",
            f"give it four parameters: def {where.rpartition(':')[2]}(key, value, "
            "headers, attempt)",
        ) from None


def _exception_class(setting: str, name: str) -> type[BaseException]:
    parts = name.split(".")
    if not all(parts):
        raise ConfigError(setting, f"{name!r} is not a dotted class name", "e.g. orders.Declined")
    if len(parts) == 1:
        found = getattr(builtins, name, None)
        if found is None:
            raise ConfigError(
                setting,
                f"{name!r} is not a builtin exception",
                "give the class with its module, e.g. orders.PaymentDeclined",
            )
    else:
        found = _dotted_attribute(setting, parts)
    if not (isinstance(found, type) and issubclass(found, BaseException)):
        raise ConfigError(
            setting,
            f"{name} is a {type(found).__name__}, not an exception class",
            "name a class that derives from Exception",
        )
    return found


def _dotted_attribute(setting: str, parts: list[str]) -> Any:
    """What ``a.b.C`` names: the longest importable prefix is the module, the rest are
    attributes (so that a class nested in a class is found too)."""
    for split in range(len(parts) - 1, 1, -1):
        module = _find_module(".".join(parts[:split]), setting)
        if module is not None:
            return _attribute(module, ".".join(parts[split:]), setting)
    return _attribute(_import_module(parts[0], setting), ".".join(parts[1:]), setting)
