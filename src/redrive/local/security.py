"""SASL/SCRAM over TLS for the local broker, as a production cluster would require.

`LocalSecurity` makes a private CA and a server certificate for 127.0.0.1 (PEM files,
which Kafka reads directly), SCRAM-SHA-512 users created when the broker's storage is
formatted (`--add-scram`, the KRaft way), the broker's listener settings, and the
client settings that redrive's own clients pass through to librdkafka.

With ``authorizer=True`` the broker also runs KRaft's ``StandardAuthorizer``: a
client may do only what an ACL grants it, except the super users (the broker's own
user and ``username``, the one that grants ACLs). ``users`` are more SCRAM users, each
with a password of its own, to grant ACLs to (docs/kafka-acls.md). The controller
listener then takes SASL/PLAIN with the broker's own user instead of plaintext, so that
no anonymous connection is a super user. Without ``authorizer`` nothing changes.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
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
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
"""KRaft's authorizer: ACLs kept in the cluster's metadata log."""
_CONTROLLER_MECHANISM = "PLAIN"
_USER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What a local user may be called: safe in StorageTool's --add-scram and in JAAS."""


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


@dataclass(frozen=True)
class LocalSecurity:
    """Certificates and credentials kept under `root` (created on first use)."""

    root: Path
    username: str = "redrive"
    users: tuple[str, ...] = ()
    """More SCRAM users besides ``username``, each with a password of its own."""
    authorizer: bool = False
    """Run the StandardAuthorizer, with the broker's user and ``username`` as super users."""

    def __post_init__(self) -> None:
        names = [self.username, *self.users]
        for name in names:
            if not _USER_NAME.fullmatch(name) or name == _ADMIN:
                raise ValueError(
                    f"local Kafka user {name!r}: use 1 to 64 of A-Z a-z 0-9 _ -, "
                    f"and not {_ADMIN!r} (the broker's own)"
                )
        if len(set(names)) != len(names):
            raise ValueError(f"local Kafka users {names}: a name is given twice")

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

    def password_of(self, user: str) -> str:
        """The password of ``username`` or one of ``users``."""
        if user != self.username and user not in self.users:
            raise KeyError(user)
        return self._secret(user)

    @property
    def super_users(self) -> tuple[str, ...]:
        """The principals the authorizer lets do anything (``super.users``)."""
        return (f"User:{_ADMIN}", f"User:{self.username}")

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
        """StorageTool arguments creating the broker's own user, the client user and
        the other users."""
        return [
            f"--add-scram={MECHANISM}=[name={name},password={self._secret(name)}]"
            for name in (_ADMIN, self.username, *self.users)
        ]

    def broker_properties(self, host: str, port: int) -> dict[str, str]:
        jaas = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{_ADMIN}" password="{self._secret(_ADMIN)}";'
        )
        props = {
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
        if self.authorizer:
            props.update(self._authorizer_properties())
        return props

    def _authorizer_properties(self) -> dict[str, str]:
        """The StandardAuthorizer, and a controller listener that authenticates: the
        broker and the controller (one process) talk as the broker's user, a super user.
        Not with SCRAM, whose credentials live in the metadata log the controller serves:
        with PLAIN, the one user in the listener's own JAAS."""
        secret = self._secret(_ADMIN)
        plain = (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{_ADMIN}" password="{secret}" user_{_ADMIN}="{secret}";'
        )
        return {
            "authorizer.class.name": AUTHORIZER,
            "super.users": ";".join(self.super_users),
            "allow.everyone.if.no.acl.found": "false",
            "listener.security.protocol.map": f"{LISTENER}:{LISTENER},CONTROLLER:SASL_PLAINTEXT",
            "sasl.mechanism.controller.protocol": _CONTROLLER_MECHANISM,
            "listener.name.controller.sasl.enabled.mechanisms": _CONTROLLER_MECHANISM,
            f"listener.name.controller.{_CONTROLLER_MECHANISM.lower()}.sasl.jaas.config": plain,
        }

    def client_config(
        self, *, password: str | None = None, user: str | None = None
    ) -> dict[str, str]:
        """librdkafka settings for a client of this broker (App(kafka=...), the
        service's `kafka` setting): as ``username``, or as ``user``, one of ``users``."""
        name = self.username if user is None else user
        return {
            "security.protocol": LISTENER,
            "sasl.mechanism": MECHANISM,
            "sasl.username": name,
            "sasl.password": self.password_of(name) if password is None else password,
            "ssl.ca.location": str(self.ca_file),
        }
