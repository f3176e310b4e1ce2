"""One way to give Kafka settings to everything a Spark command runs.

Users write Kafka client settings once, with librdkafka's names, as for
``App(kafka={...})`` and the retry service's ``kafka`` setting. redrive's own clients
(the topic checks, the exactly-once producers) take them as they are; Spark's Kafka
source and sink are the Java client, which names some of them differently or wants
them in another form. :func:`spark_kafka_options` gives the Java client's settings, as
Spark's ``kafka.``-prefixed options:

- the names both clients share pass through (``security.protocol``, ``client.id``...);
- ``sasl.mechanisms`` is Java's ``sasl.mechanism``; ``sasl.username`` and
  ``sasl.password`` become the ``sasl.jaas.config`` of the mechanism's login module
  (PLAIN, SCRAM-SHA-256/512);
- ``ssl.ca.location`` (a PEM file) becomes a PEM truststore; ``ssl.certificate.
  location`` and ``ssl.key.location`` (PEM files) a PEM keystore, given as the files'
  contents, as the Java client takes them;
- ``ssl.endpoint.identification.algorithm=none`` is Java's empty value.

A setting with no Java counterpart (librdkafka's tuning: ``socket.keepalive.enable``,
``statistics.interval.ms``...) goes to redrive's own clients only. One that would make
the two clients connect differently and cannot be carried (a SASL mechanism without a
login module here, a PEM key without its certificate) is a ConfigError naming it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from redrive.errors import ConfigError

SHARED: Final = frozenset(
    {
        "security.protocol",
        "client.id",
        "client.dns.lookup",
        "ssl.key.password",
        "ssl.cipher.suites",
        "ssl.endpoint.identification.algorithm",
        "sasl.kerberos.service.name",
        "sasl.mechanism",
        "socket.connection.setup.timeout.ms",
        "reconnect.backoff.ms",
        "reconnect.backoff.max.ms",
        "metadata.max.age.ms",
    }
)
"""Settings both clients name and read alike."""

LOGIN_MODULES: Final = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def spark_kafka_options(config: Mapping[str, str], setting: str = "--kafka") -> dict[str, str]:
    """The Java client's settings for librdkafka's ``config``, as Spark's ``kafka.``
    options; a ConfigError naming ``setting`` for one that cannot be carried."""
    java = {name: value for name, value in config.items() if name in SHARED}
    if "sasl.mechanisms" in config:
        java["sasl.mechanism"] = config["sasl.mechanisms"]
    if java.get("ssl.endpoint.identification.algorithm") == "none":
        java["ssl.endpoint.identification.algorithm"] = ""
    if "sasl.username" in config or "sasl.password" in config:
        java["sasl.jaas.config"] = _jaas(config, java.get("sasl.mechanism", "GSSAPI"), setting)
    if "ssl.ca.location" in config:
        java["ssl.truststore.type"] = "PEM"
        java["ssl.truststore.location"] = config["ssl.ca.location"]
    if "ssl.certificate.location" in config or "ssl.key.location" in config:
        java.update(_keystore(config, setting))
    return {f"kafka.{name}": value for name, value in java.items()}


def _jaas(config: Mapping[str, str], mechanism: str, setting: str) -> str:
    module = LOGIN_MODULES.get(mechanism.upper())
    if module is None:
        raise ConfigError(
            f"{setting} sasl.mechanism",
            f"{mechanism!r} with sasl.username/sasl.password: no login module to give "
            "Spark's Java client",
            f"use one of {', '.join(LOGIN_MODULES)}, or give Spark kafka.sasl.jaas.config yourself",
        )
    # JSON strings are JAAS strings: quoted, with backslashes and quotes escaped.
    username = json.dumps(config.get("sasl.username", ""))
    password = json.dumps(config.get("sasl.password", ""))
    return f"{module} required username={username} password={password};"


def _keystore(config: Mapping[str, str], setting: str) -> dict[str, str]:
    paths = {name: config.get(name) for name in ("ssl.certificate.location", "ssl.key.location")}
    missing = [name for name, path in paths.items() if not path]
    if missing:
        raise ConfigError(
            f"{setting} {missing[0]}",
            "a client certificate needs both ssl.certificate.location and ssl.key.location",
            "give both PEM files",
        )
    contents = {}
    for name, path in paths.items():
        try:
            contents[name] = Path(str(path)).read_text()
        except OSError as exc:
            raise ConfigError(f"{setting} {name}", f"cannot read {path}: {exc.strerror}") from None
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": contents["ssl.certificate.location"],
        "ssl.keystore.key": contents["ssl.key.location"],
    }
