"""Kafka settings written once, with librdkafka's names, as Spark's Java client takes
them (redrive.spark.kafka_options)."""

from __future__ import annotations

from pathlib import Path

import pytest

from redrive.errors import ConfigError
from redrive.local.security import MECHANISM, LocalSecurity
from redrive.spark.kafka_options import spark_kafka_options

pytestmark = pytest.mark.unit


def test_the_local_brokers_sasl_over_tls_settings_carry_over(tmp_path: Path) -> None:
    """The settings an App uses with the dev stack's secured broker (SCRAM over TLS)."""
    security = LocalSecurity(tmp_path)
    options = spark_kafka_options(security.client_config())
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.sasl.mechanism"] == MECHANISM
    assert options["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{security.username}" password="{security.password}";'
    )
    assert options["kafka.ssl.truststore.type"] == "PEM"
    assert options["kafka.ssl.truststore.location"] == str(security.ca_file)
    assert not any(name.startswith("kafka.sasl.username") for name in options)


def test_a_password_with_quotes_is_escaped_for_jaas() -> None:
    options = spark_kafka_options(
        {"sasl.mechanisms": "PLAIN", "sasl.username": "u", "sasl.password": 'p"w\\d'}
    )
    assert options["kafka.sasl.mechanism"] == "PLAIN"
    assert options["kafka.sasl.jaas.config"].endswith('username="u" password="p\\"w\\\\d";')


def test_a_client_certificate_becomes_a_pem_keystore(tmp_path: Path) -> None:
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    cert.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n")
    options = spark_kafka_options(
        {
            "security.protocol": "SSL",
            "ssl.certificate.location": str(cert),
            "ssl.key.location": str(key),
            "ssl.endpoint.identification.algorithm": "none",
        }
    )
    assert options["kafka.ssl.keystore.type"] == "PEM"
    assert options["kafka.ssl.keystore.certificate.chain"] == cert.read_text()
    assert options["kafka.ssl.keystore.key"] == key.read_text()
    assert options["kafka.ssl.endpoint.identification.algorithm"] == ""


def test_librdkafka_tuning_stays_with_librdkafka() -> None:
    options = spark_kafka_options(
        {"security.protocol": "SSL", "socket.keepalive.enable": "true", "linger.ms": "5"}
    )
    assert options == {"kafka.security.protocol": "SSL"}


@pytest.mark.parametrize(
    ("config", "setting"),
    [
        (
            {"sasl.mechanism": "OAUTHBEARER", "sasl.username": "u"},
            "--kafka sasl.mechanism",
        ),
        ({"ssl.key.location": "/k.pem"}, "--kafka ssl.certificate.location"),
        (
            {"ssl.certificate.location": "/no/such.pem", "ssl.key.location": "/no/k.pem"},
            "--kafka ssl.certificate.location",
        ),
    ],
)
def test_what_cannot_be_carried_names_the_setting(config: dict[str, str], setting: str) -> None:
    with pytest.raises(ConfigError) as raised:
        spark_kafka_options(config)
    assert raised.value.setting == setting
