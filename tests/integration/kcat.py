"""Records that confluent-kafka's producer cannot write, written with kcat.

confluent-kafka's Python producer takes header names as str (a bytes name is passed
through str(), so b"x-\\xff" arrives as the text "b'x-\\\\xff'"): it cannot write a
header name that is not UTF-8. Any other producer can, and kcat (a librdkafka
command-line client) does it from its arguments, which carry any bytes but NUL.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

RawHeader = tuple[bytes, bytes | None]


def kcat_produce(
    bootstrap: str,
    topic: str,
    key: bytes | None,
    value: bytes,
    headers: Sequence[RawHeader],
    partition: int | None = None,
) -> None:
    """One record with raw header names. Keys and headers travel as arguments: no NUL
    in them, and no ``=`` in a name (kcat splits there). The value travels as a file,
    byte for byte, and must not be empty (kcat skips an empty file). An empty key is
    no key; a header value of None is a null value."""
    if not value:
        raise ValueError("kcat cannot send an empty value from a file")
    if b"\x00" in (key or b"") or any(b"\x00" in n + (v or b"") or b"=" in n for n, v in headers):
        raise ValueError("kcat cannot write NUL in keys or headers, nor '=' in a header name")
    with tempfile.TemporaryDirectory(prefix="redrive-kcat-") as folder:
        path = Path(folder) / "value"
        path.write_bytes(value)
        args: list[bytes | str] = ["kcat", "-P", "-b", bootstrap, "-t", topic]
        if partition is not None:
            args += ["-p", str(partition)]
        if key:
            args += [b"-k", key]
        for name, raw in headers:
            args += [b"-H", name if raw is None else name + b"=" + raw]
        args.append(str(path))
        done = subprocess.run(args, capture_output=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"kcat failed ({done.returncode}): {done.stderr.decode(errors='replace')}"
        )
