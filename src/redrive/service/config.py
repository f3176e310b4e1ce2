"""The retry service's settings: environment variables (REDRIVE_*) and a YAML file.

Precedence, highest first: explicit arguments, environment variables, the YAML file
(`--config` or REDRIVE_CONFIG), defaults. Everything is validated at start-up; a bad
value stops the service with a message naming the setting and why.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from redrive.destinations import DestinationAllowlist, check_patterns
from redrive.errors import ConfigError
from redrive.headers import MAX_TOPIC_LENGTH, is_topic_name
from redrive.partitioners import DEFAULT_PARTITIONER, Partitioner, raw_partitioner
from redrive.service.ingest import Format
from redrive.signing import KeyRing, SignatureCheck, key_ring
from redrive.topic_names import DLQ_TOPIC, REQUESTS_TOPIC

Role = Literal["intake", "scheduler"]
ALL_ROLES: tuple[Role, ...] = ("intake", "scheduler")


class IngestTopic(BaseModel):
    """A dead-letter topic (or a pattern of them) whose records intake stores as dead
    letters, read as ``format`` (see :mod:`redrive.service.ingest`)."""

    model_config = ConfigDict(extra="forbid")

    topic: str = Field(
        description="A topic name, or a regular expression starting with ^ (librdkafka's "
        "subscription pattern, e.g. ^.*-dlt$)."
    )
    format: Format = Field(
        "auto",
        description="redrive, spring (Spring Kafka's dead-letter topics), connect (Kafka "
        "Connect's error topics), raw (no metadata), or auto (recognised by the headers).",
    )

    @field_validator("topic")
    @classmethod
    def _topic_or_pattern(cls, value: str) -> str:
        if value.startswith("^"):
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"{value!r} is not a regular expression: {exc}") from None
        elif not is_topic_name(value):
            raise ValueError(f"{value!r} is not a legal Kafka topic name nor a ^pattern")
        return value

    def matches(self, topic: str) -> bool:
        if self.topic.startswith("^"):
            return re.search(self.topic, topic) is not None
        return topic == self.topic


class ServiceSettings(BaseSettings):
    """Settings of `redrive serve`. Each field is also REDRIVE_<NAME> in the environment."""

    model_config = SettingsConfigDict(
        env_prefix="REDRIVE_", extra="forbid", env_nested_delimiter="__"
    )

    bootstrap: str | None = Field(
        None, description="Kafka bootstrap servers; unset: the local stack's broker."
    )
    database_url: str | None = Field(
        None, description="PostgreSQL URL; unset: the embedded PostgreSQL (the embedded default)."
    )
    kafka: dict[str, str] = Field(
        default_factory=dict,
        description="Extra librdkafka settings for every client (security.protocol, sasl.*, "
        "ssl.*...).",
    )
    intake_kafka: dict[str, str | int] = Field(
        default_factory=dict,
        description="librdkafka settings for intake's consumer only (e.g. fetch sizes).",
    )
    scheduler_kafka: dict[str, str | int] = Field(
        default_factory=dict,
        description="librdkafka settings for the scheduler's producer only (e.g. "
        "compression.type, linger.ms).",
    )
    partitioner: Partitioner = Field(
        DEFAULT_PARTITIONER,
        description="How the service's producers place a record that names no partition "
        "(a retry without redrive-partition, a replay to another topic, a mirrored dead "
        "letter): by its key, as the Java producer does (murmur2_random), or as "
        "librdkafka does by default (consistent_random); also murmur2, consistent, "
        "fnv1a_random, fnv1a.",
    )
    requests_topic: str = REQUESTS_TOPIC
    dlq_topic: str = DLQ_TOPIC
    mirror_dead_letters: bool = Field(
        False, description="Also publish each dead letter to dlq_topic."
    )
    allowed_destinations: list[str] = Field(
        default_factory=lambda: ["*"],
        description="Topic names or glob patterns a request may target. Internal topics "
        "(__*) and the requests topic are always refused.",
    )
    require_signatures: bool = Field(
        False,
        description="Refuse every request without a valid redrive-signature (a dead letter "
        "with reason invalid_signature, delivered nowhere). Off: unsigned requests are "
        "accepted, and a signature naming one of signing_keys must still verify.",
    )
    signing_keys: list[str] = Field(
        default_factory=list,
        repr=False,
        description="Keys requests are verified with, as id=secret (secret in base64, at "
        'least 32 bytes), e.g. ["k2026b=...", "k2026a=..."]. Keep an old key listed '
        "while requests signed with it may still arrive.",
    )
    signing_key_files: list[str] = Field(
        default_factory=list,
        description="Files of id=secret lines, or folders of one file per key (named by "
        "its key id), read at start-up along with signing_keys.",
    )
    group_id: str = "redrive-service"
    instance_id: str | None = Field(
        None,
        description="Intake's static membership of its consumer group (group.instance.id): "
        "a restarted instance takes its partitions back at once instead of after the "
        "session timeout. Unset: the host name and http_port when the port is fixed, none "
        "when it is 0. Empty: no static membership. Each instance needs its own.",
    )
    roles: list[Role] = Field(default_factory=lambda: list(ALL_ROLES))
    workers: int = Field(
        1,
        description="Whole services (intake and scheduler) this `redrive serve` runs as "
        "processes side by side, each taking a share of the work; auto: one per core. "
        "One process's Python runs under one interpreter lock: with cores to spare, "
        "2 or more carry more.",
    )
    ingest: list[IngestTopic] = Field(
        default_factory=list,
        description="Dead-letter topics of other systems (or of redrive's Apps, "
        "<topic>.dlq) whose records intake stores as dead letters, e.g. "
        '[{"topic": "orders-dlt", "format": "spring"}, {"topic": "^.*\\.dlq$"}].',
    )
    intake_batch_size: int = Field(500, ge=1, le=100_000)
    intake_linger_ms: int = Field(
        20,
        ge=0,
        le=1000,
        description="How long a batch may fill once its first request "
        "arrived: fewer, larger database commits under load.",
    )
    scheduler_batch_size: int = Field(500, ge=1, le=100_000)
    lease_seconds: float = Field(
        30.0,
        gt=0,
        description="Longest a scheduler may hold claimed rows: a hung instance's claim "
        "is ended after this long and its rows go to the others.",
    )
    max_delay_days: float = Field(
        365.0, gt=0, description="A retry-at further in the future is refused."
    )
    http_host: str = "127.0.0.1"
    http_port: int = Field(8080, ge=0, le=65535)
    store_retry_max_seconds: float = Field(
        10.0, gt=0, description="Longest wait between reconnection attempts to PostgreSQL."
    )
    log_format: Literal["json", "console"] = "console"
    require_token_for_reads: bool = Field(
        False,
        description="Reads of the API and UI need a viewer token too (payloads are "
        "sensitive in many shops).",
    )
    max_request_bytes: int = Field(
        1_048_576, ge=1024, description="Largest API or UI request body accepted (413 above)."
    )
    replay_rate_per_second: float = Field(
        500.0, ge=1, description="Pace of bulk replays (messages a second, at least 1)."
    )
    replay_max_per_request: int = Field(
        10_000,
        ge=1,
        description="Most dead letters one replay job takes; the request reports how many "
        "more match.",
    )
    quarantine_after_replays: int = Field(
        3,
        ge=1,
        le=1_000_000,
        description="The loop guard: a dead letter that came back dead after this many "
        "replays is quarantined (bulk replays skip it; replaying it alone needs an "
        "override).",
    )
    history_retention_days: float = Field(
        7.0,
        ge=0,
        le=3650,
        description="How long delivered retries are kept, for a record's story (0: none kept).",
    )
    repeat_window_days: float = Field(
        7.0,
        gt=0,
        le=3650,
        description="How long the identity of an accepted request is remembered after its "
        "due time, so that its sender writing it again is dropped as a repeat.",
    )

    @model_validator(mode="after")
    def _ingest_apart(self) -> ServiceSettings:
        """Intake reads the requests topic as requests: it cannot also ingest it; and a
        mirrored dead letter would be ingested again, and mirrored again, for ever."""
        for source in self.ingest:
            if source.matches(self.requests_topic):
                raise ValueError(
                    f"ingest: {source.topic!r} names the requests topic "
                    f"{self.requests_topic!r}, which intake reads as retry requests"
                )
            if self.mirror_dead_letters and source.matches(self.dlq_topic):
                raise ValueError(
                    f"ingest: {source.topic!r} names dlq_topic {self.dlq_topic!r}, where "
                    "mirror_dead_letters writes: each letter would come back for ever"
                )
        return self

    @field_validator("signing_keys")
    @classmethod
    def _signing_keys(cls, value: list[str]) -> list[str]:
        try:
            key_ring(value)
        except ConfigError as exc:  # the secret itself never goes in the message
            raise ValueError(exc.problem) from None
        return value

    @model_validator(mode="after")
    def _signatures(self) -> ServiceSettings:
        self.signature_check()  # a bad key file stops start-up here, naming the setting
        if self.require_signatures and not (self.signing_keys or self.signing_key_files):
            raise ConfigError(
                "require_signatures (REDRIVE_REQUIRE_SIGNATURES)",
                "signatures are required, and no key is given to check them with",
                "set signing_keys (REDRIVE_SIGNING_KEYS) or signing_key_files",
            )
        return self

    def key_ring(self) -> KeyRing | None:
        """The service's keys (``signing_keys``, then ``signing_key_files``); None
        without any. The scheduler signs with them what it changes of a delivery."""
        return key_ring(self.signing_keys, self.signing_key_files)

    def signature_check(self) -> SignatureCheck | None:
        """What intake asks of each request's signature; None without keys (nothing to
        check)."""
        keys = self.key_ring()
        return None if keys is None else SignatureCheck(keys, self.require_signatures)

    def ingest_format(self, topic: str) -> Format | None:
        """How intake reads a record of ``topic``: None for the requests topic, else the
        format of the first ``ingest`` entry that names it."""
        for source in self.ingest:
            if source.matches(topic):
                return source.format
        return None

    @field_validator("requests_topic", "dlq_topic")
    @classmethod
    def _topic_name(cls, value: str) -> str:
        if not is_topic_name(value):
            raise ValueError(f"{value!r} is not a legal Kafka topic name")
        return value

    @field_validator("kafka", "scheduler_kafka")
    @classmethod
    def _no_raw_partitioner(cls, value: dict[str, Any]) -> dict[str, Any]:
        # One way to choose it: two could disagree, and which won would be luck.
        if (raw := raw_partitioner(value)) is not None:
            raise ValueError(
                f"names librdkafka's {raw!r}: set the partitioner setting "
                "(REDRIVE_PARTITIONER) instead"
            )
        return value

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: Any) -> int:
        if value == "auto":
            return max(1, os.cpu_count() or 1)
        if isinstance(value, int) and not isinstance(value, bool):
            count = value
        elif isinstance(value, str) and value.strip().isdigit():
            count = int(value)
        else:
            count = 0
        if not 1 <= count <= 64:
            raise ValueError("must be auto or a number of processes from 1 to 64")
        return count

    @field_validator("instance_id")
    @classmethod
    def _instance_id(cls, value: str | None) -> str | None:
        # The broker checks group.instance.id like a topic name; "" turns static
        # membership off.
        if value and not is_topic_name(value):
            raise ValueError(
                f"{value!r} is not a legal group instance id (letters, digits, '.', '_', "
                f"'-'; at most {MAX_TOPIC_LENGTH})"
            )
        return value

    @field_validator("allowed_destinations")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        check_patterns(value)
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        yaml_file = os.environ.get("REDRIVE_CONFIG")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if yaml_file:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file))
        return tuple(sources)

    def destination_allowed(self, topic: str) -> bool:
        """True if a request may deliver to `topic` (see allowed_destinations)."""
        allowlist = DestinationAllowlist(tuple(self.allowed_destinations), self.requests_topic)
        return allowlist.allows(topic)

    def group_instance_id(self) -> str | None:
        """Intake's group.instance.id, or None for dynamic membership (see instance_id).

        The default must be stable across restarts of one instance and differ between
        instances: two instances on one host cannot both listen on one fixed port, and
        hosts have distinct names. With port 0 nothing stable tells instances apart.
        """
        if "group.instance.id" in self.intake_kafka:  # the explicit librdkafka setting wins
            return str(self.intake_kafka["group.instance.id"]) or None
        if self.instance_id is not None:
            return self.instance_id or None
        if not self.http_port:
            return None
        return default_instance_id(socket.gethostname(), self.http_port)


def default_instance_id(host: str, port: int) -> str:
    """`redrive-<host>-<port>`, with what the broker does not accept in an id replaced."""
    safe = re.sub(r"[^a-zA-Z0-9._-]", "-", host)[:200] or "host"
    return f"redrive-{safe}-{port}"


SECRET_SETTINGS = frozenset({"signing_keys", "settings"})
"""Settings whose values an error never quotes ("settings": the model's own checks)."""


def load_settings(config_file: Path | None = None, **overrides: Any) -> ServiceSettings:
    """Load and validate; a problem becomes a ConfigError naming the setting."""
    if config_file is not None:
        if not config_file.is_file():
            raise ConfigError("--config", f"{config_file} is not a readable file")
        os.environ["REDRIVE_CONFIG"] = str(config_file)
    try:
        return ServiceSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "settings"
        env = "REDRIVE_" + str(first["loc"][0]).upper() if first["loc"] else ""
        where = f"{field} ({env})" if env else field
        count = len(exc.errors())
        more = f" (and {count - 1} more problem(s))" if count > 1 else ""
        given = "" if field in SECRET_SETTINGS else f"; got {first.get('input')!r}"
        raise ConfigError(
            where,
            f"{first['msg']}{given}{more}",
            "fix the environment variable or the YAML config file",
        ) from None
    except (OSError, ValueError) as exc:  # an unreadable or malformed YAML file
        raise ConfigError("--config", str(exc), "fix the YAML config file") from None
