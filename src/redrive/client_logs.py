"""librdkafka's own log lines, through redrive's structured logging.

Left alone, every confluent-kafka client prints librdkafka's log lines raw on stderr
(`%4|1795426292.751|GETPID|rdkafka#producer-4| [thrd:main]: ...`), between whatever
the program prints. Every client redrive creates takes its settings through
:func:`with_client_logs`, which hands librdkafka a `logger`: its lines become
`librdkafka` events of redrive's logging (structlog), with the facility and the
client's name as fields, and below warnings they are not produced at all.

confluent-kafka delivers these lines from the client's own `poll` (and `flush`,
`consume`), in the polling thread. A setting the caller gives (`logger`,
`log_level`, e.g. through an App's or the service's `kafka` settings) wins.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Final

import structlog

WARNING: Final = 4
"""librdkafka's (syslog's) level numbers: 3 error, 4 warning, 5 notice, 6 info, 7 debug."""
SILENT: Final = 0
"""No log lines at all (e.g. while polling a broker that is still starting)."""


class LibrdkafkaLog:
    """What confluent-kafka calls as its `logger`: ``log(level, "%s [%s] %s", facility,
    client, text)``, with a Python logging level; forwarded to structlog as configured
    at the time of the line (the lines are rare: warnings and worse)."""

    def log(self, level: int, msg: str, *args: Any) -> None:
        # A logger that raises would crash the client's poll: a line is not worth that.
        with contextlib.suppress(Exception):
            log = structlog.get_logger("redrive.kafka")
            if len(args) == 3:
                facility, client, text = args
                if facility in PASSING and str(text).endswith("retrying"):
                    return
                log.log(level, "librdkafka", facility=facility, client=client, text=text)
            else:
                log.log(level, "librdkafka", text=msg % args if args else msg)


_LOGGER: Final = LibrdkafkaLog()

PASSING: Final = frozenset({"GETPID"})
"""Facilities whose "...: retrying" lines are not shown: a producer id asked of a
coordinator that is loading or moving (a broker just started), which librdkafka asks
again for; should it never come, the call that needs it fails, and says so."""


def with_client_logs(config: Mapping[str, Any], *, level: int = WARNING) -> dict[str, Any]:
    """`config` for a confluent-kafka client (Consumer, Producer, AdminClient) whose
    librdkafka log lines go through redrive's logging, from `level` up."""
    return {"logger": _LOGGER, "log_level": level, **config}
