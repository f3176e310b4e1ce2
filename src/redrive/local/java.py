"""Finding a Java runtime good enough for the Kafka broker (17 or newer)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from redrive.errors import ConfigError

MIN_JAVA = 17
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def find_java() -> str:
    """Path of a `java` of version 17+, from JAVA_HOME or PATH, or a ConfigError saying why."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if not candidate.exists():
            raise ConfigError(
                "JAVA_HOME",
                f"{java_home} has no bin/java",
                "point JAVA_HOME at a Java 17+ installation, or unset it to use java from PATH",
            )
        java = str(candidate)
    else:
        found = shutil.which("java")
        if found is None:
            raise ConfigError(
                "java",
                "no Java runtime on PATH; the local Kafka broker runs on Java 17+",
                "install one (apt-get install openjdk-17-jre-headless) or set JAVA_HOME",
            )
        java = found
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = _VERSION.search(out.stderr + out.stdout)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):  # "1.8.0_392" style
        major = int(match.group(2))
    if major < MIN_JAVA:
        raise ConfigError(
            "java",
            f"{java} is Java {major or 'of unknown version'}; Kafka 4 needs Java {MIN_JAVA}+",
            "install Java 17+ (apt-get install openjdk-17-jre-headless) or set JAVA_HOME",
        )
    return java
