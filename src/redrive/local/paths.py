"""Where the local stack keeps its state (data, logs, pids), and its resources.

State is per user by default so that `redrive local up`, `redrive serve` and the
demo all find the same broker and database whatever the current directory; tests
point REDRIVE_STATE_DIR at a temporary folder of their own. The jar cache, which
Spark shares, is :func:`redrive.jars.cache_dir`.
"""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    """The local stack's state folder: REDRIVE_STATE_DIR, else the XDG state home."""
    explicit = os.environ.get("REDRIVE_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser().resolve()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return (base / "redrive").resolve()


def resource(name: str) -> Path:
    """A file shipped inside the package (poms, logging config)."""
    return Path(__file__).parent / "resources" / name
