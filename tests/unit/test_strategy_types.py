"""Strategies are typed values: combinations of options that mean nothing are refused
by mypy before anything runs, and by a check when the handler is registered for
callers no type checker reads.

tests/typing/misuses.py marks each refused call with a ``# refused:`` comment on the
line before it; tests/typing/allowed.py writes the same registrations as they mean
something. mypy runs on both with the project's settings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mypy import api

from redrive import App
from redrive.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
TYPING = ROOT / "tests" / "typing"
MARK = "# refused: "


def refused_calls() -> dict[int, tuple[str, str]]:
    """Line number of each refused call -> (what it combines, the call's code)."""
    lines = (TYPING / "misuses.py").read_text().splitlines()
    return {
        number + 2: (line.removeprefix(MARK), lines[number + 1])
        for number, line in enumerate(lines)
        if line.startswith(MARK)
    }


def mypy_errors(path: Path) -> dict[int, list[str]]:
    """mypy's errors on one file by line, with the project's settings."""
    out, err, _ = api.run(
        [str(path), "--config-file", str(ROOT / "pyproject.toml"), "--no-error-summary"]
    )
    assert not err, err
    errors: dict[int, list[str]] = {}
    for found in re.finditer(
        rf"^(?:.*/)?{re.escape(path.name)}:(\d+): error: (.*)$", out, re.MULTILINE
    ):
        errors.setdefault(int(found[1]), []).append(found[2])
    return errors


def test_mypy_refuses_every_combination_that_means_nothing() -> None:
    refused = refused_calls()
    assert len(refused) >= 8
    errors = mypy_errors(TYPING / "misuses.py")
    missed = {what for line, (what, _) in refused.items() if line not in errors}
    assert not missed, f"mypy accepted: {sorted(missed)}"
    # Nothing else in the file is wrong: each error is one of the marked calls'.
    assert set(errors) <= set(refused), {n: errors[n] for n in set(errors) - set(refused)}
    print(f"mypy refuses {len(refused)} combinations of strategy options")


def test_mypy_accepts_the_same_registrations_written_as_they_mean_something() -> None:
    assert mypy_errors(TYPING / "allowed.py") == {}


def preamble() -> str:
    """misuses.py up to its first refused call: the imports, handlers and App."""
    return (TYPING / "misuses.py").read_text().split(MARK, 1)[0]


@pytest.mark.parametrize(
    "call",
    [code for _, code in refused_calls().values()],
    ids=[what for what, _ in refused_calls().values()],
)
def test_each_refused_call_is_refused_at_registration_without_a_type_checker(call: str) -> None:
    namespace: dict[str, object] = {}
    exec(compile(preamble(), "misuses.py", "exec"), namespace)
    with pytest.raises((TypeError, ConfigError)) as refused:
        exec(compile(call, "misuses.py", "exec"), namespace)
    app = namespace["app"]
    assert isinstance(app, App) and app.routes == {}
    print(f"{call.strip()}\n  -> {type(refused.value).__name__}: {refused.value}")
