"""SASL/SCRAM over TLS for the local broker, as a production cluster would require.

`LocalSecurity` makes a private CA and a server certificate for 127.0.0.1 (PEM files,
which Kafka reads directly), SCRAM-SHA-512 users created when the broker's storage is
formatted (`--add-scram`, the KRaft way), the broker's listener settings, and the
client settings that redrive's own clients pass through to librdkafka.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

MECHANISM = "SCRAM-SHA-512"
LISTENER = "SASL_SSL"
_ADMIN = "broker-admin"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


@dataclass(frozen=True)
class LocalSecurity:
    """Certificates and credentials kept under `root` (created on first use)."""

    root: Path
    username: str = "redrive"

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.pem"

    @property
    def server_file(self) -> Path:
        return self.root / "server.pem"

    def _secret(self, name: str) -> str:
        path = self.root / f"{name}.password"
        if not path.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_urlsafe(18))
            path.chmod(0o600)
        return path.read_text().strip()

    @property
    def password(self) -> str:
        return self._secret(self.username)

    def ensure_certificates(self) -> None:
        """A CA and a server certificate for 127.0.0.1 and localhost, valid for a year."""
        if self.ca_file.exists() and self.server_file.exists():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(_name("redrive local CA"))
            .issuer_name(_name("redrive local CA"))
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name("127.0.0.1"))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
                ),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        self.ca_file.write_bytes(ca_cert.public_bytes(pem))
        # Kafka's PEM keystore: an unencrypted PKCS#8 key, then the certificate chain.
        self.server_file.write_bytes(
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
            + cert.public_bytes(pem)
            + ca_cert.public_bytes(pem)
        )
        self.server_file.chmod(0o600)

    def scram_format_args(self) -> list[str]:
        """StorageTool arguments creating the broker's own user and the client user."""
        return [
            f"--add-scram={MECHANISM}=[name={_ADMIN},password={self._secret(_ADMIN)}]",
            f"--add-scram={MECHANISM}=[name={self.username},password={self.password}]",
        ]

    def broker_properties(self, host: str, port: int) -> dict[str, str]:
        jaas = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{_ADMIN}" password="{self._secret(_ADMIN)}";'
        )
        return {
            "listeners": f"{LISTENER}://{host}:{port},CONTROLLER://{host}:{{controller}}",
            "advertised.listeners": f"{LISTENER}://{host}:{port}",
            "inter.broker.listener.name": LISTENER,
            "listener.security.protocol.map": f"{LISTENER}:{LISTENER},CONTROLLER:PLAINTEXT",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.{LISTENER.lower()}.{MECHANISM.lower()}.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.server_file),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
            "ssl.endpoint.identification.algorithm": "https",
        }

    def client_config(self, *, password: str | None = None) -> dict[str, str]:
        """librdkafka settings for a client of this broker (App(kafka=...), the
        service's `kafka` setting)."""
        return {
            "security.protocol": LISTENER,
            "sasl.mechanism": MECHANISM,
            "sasl.username": self.username,
            "sasl.password": self.password if password is None else password,
            "ssl.ca.location": str(self.ca_file),
        }
