"""The neighbours' Maven project (java/), built once into the jar cache.

Like the broker's jars (redrive.jars), the build lands in a folder of the cache named
by a hash, here of the pom and every source file, so a changed program is built anew
and an unchanged one never again. Several pytest-xdist workers may ask at once: one
builds under a lock on the folder, the others wait and find it complete. The folder
is marked complete only once Maven succeeded, so an interrupted build is redone.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
from pathlib import Path

from redrive import jars
from redrive.errors import ConfigError

PROJECT = Path(__file__).resolve().parent / "java"
MAIN_CLASS = "dev.redrive.neighbours.Main"
JAR_NAME = "redrive-neighbours.jar"


def _sources() -> list[Path]:
    files = (p for p in PROJECT.rglob("*") if p.is_file())
    # A build by hand (mvn package in java/) leaves target/ behind: not a source.
    return sorted(p for p in files if p.relative_to(PROJECT).parts[0] != "target")


def digest() -> str:
    """A hash of the project: each file's path (relative) and bytes."""
    hasher = hashlib.sha256()
    for path in _sources():
        hasher.update(path.relative_to(PROJECT).as_posix().encode() + b"\0")
        hasher.update(path.read_bytes() + b"\0")
    return hasher.hexdigest()[:12]


def build_dir() -> Path:
    return jars.cache_dir() / "neighbours" / f"neighbours-{digest()}"


def classpath() -> str:
    """The programs' classpath, building them first if this project was never built."""
    return f"{build()}/lib/*"


def build() -> Path:
    target = build_dir()
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / ".complete").exists():
            _build(target)
    return target


def _build(target: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ConfigError(
            "mvn", "Maven builds the neighbour programs and is not on PATH", "apt-get install maven"
        )
    if target.exists():
        shutil.rmtree(target)
    (target / "lib").mkdir(parents=True)
    log_file = target / "build.log"
    cmd = [
        mvn,
        "-B",
        "-s",
        str(jars.resource("maven-settings.xml")),
        "-f",
        str(PROJECT / "pom.xml"),
        "package",
        "dependency:copy-dependencies",
        f"-Dneighbours.build={target / 'build'}",
        f"-DoutputDirectory={target / 'lib'}",
        "-DincludeScope=runtime",
    ]
    with open(log_file, "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-30:])
        raise ConfigError(
            "mvn",
            f"building the neighbour programs failed (exit code {rc}):\n{tail}",
            f"read {log_file}; nothing was marked built",
        )
    shutil.copy2(target / "build" / JAR_NAME, target / "lib" / JAR_NAME)
    (target / ".complete").write_text("ok\n")
