"""JVM jars from Maven Central, fetched once into the cache with Maven itself.

Each set of jars is described by a pom shipped in the package; `fetch` runs
`mvn dependency:copy-dependencies` on it into `<cache>/jars/<name>` and marks the
folder complete only when Maven succeeded, so an interrupted download is redone.
Both the Spark connector (:mod:`redrive.spark.session`) and the dev stack's broker
(:mod:`redrive.local.kafka`) take their jars from here.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

from redrive.errors import ConfigError

_DOWNLOADED = re.compile(r"Downloaded from \S+: \S+/([^/\s]+\.jar)")

# The poms (which artifacts, which versions) and Maven's settings are package data in
# redrive/maven (see pyproject's package-data).
_RESOURCES: Final = Path(__file__).parent / "maven"


def cache_dir() -> Path:
    """Downloaded jars, shared by every state folder: REDRIVE_CACHE_DIR, else XDG cache."""
    explicit = os.environ.get("REDRIVE_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "redrive").resolve()


def resource(name: str) -> Path:
    """A pom or Maven's settings, shipped inside the package."""
    return _RESOURCES / name


def jar_dir(pom_name: str) -> Path:
    """The cache folder for one pom's jars; a changed pom gets a new folder."""
    pom = resource(pom_name)
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:12]
    return cache_dir() / "jars" / f"{pom.stem}-{digest}"


def fetch(pom_name: str, what: str, *, quiet: bool = False) -> Path:
    """Make sure the jars of `pom_name` are in the cache; download them on first use.

    Several processes may ask at once (test workers, a demo beside a service): one
    downloads under a lock on the cache folder, the others wait and find it complete.
    """
    target = jar_dir(pom_name)
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return target
        return _download(pom_name, what, target, quiet=quiet)


def _download(pom_name: str, what: str, target: Path, *, quiet: bool) -> Path:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ConfigError(
            "mvn",
            f"Maven is needed once to fetch {what} from Maven Central and is not on PATH",
            "install it (apt-get install maven) or put it on PATH, then run again",
        )
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    if not quiet:
        print(f"Fetching {what} from Maven Central into {target} (first run only)...", flush=True)
    cmd = [
        mvn,
        "-B",
        "-s",
        str(resource("maven-settings.xml")),
        "-f",
        str(resource(pom_name)),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={target}",
        "-DincludeScope=runtime",
    ]
    log_lines: list[str] = []
    count = 0
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log_lines.append(line.rstrip())
            match = _DOWNLOADED.search(line)
            if match and not quiet:
                count += 1
                print(f"  [{count:3d}] {match.group(1)}", flush=True)
        rc = proc.wait()
    if rc != 0:
        tail = "\n".join(log_lines[-25:])
        print(tail, file=sys.stderr)
        raise ConfigError(
            "mvn",
            f"Maven could not fetch {what} (exit code {rc}); its last lines are above",
            "check that Maven Central is reachable and run again; nothing was cached",
        )
    (target / ".complete").write_text("ok\n")
    if not quiet:
        n = len(list(target.glob("*.jar")))
        print(f"Fetched {n} jars for {what}.", flush=True)
    return target
