"""The ACL recipe of docs/kafka-acls.md, on a broker that enforces it.

A broker of this module's own takes only SASL/SCRAM over TLS and runs KRaft's
StandardAuthorizer (``LocalSecurity(authorizer=True)``): ``admin`` is a super user;
``billing`` (the App of group billing), ``redrive`` (the retry service) and
``mallory`` get only what the recipe grants them. Mallory holds the credentials of
``User:shop``, the producer of the source topic: what a careless or hostile producer of
``orders`` can do.

The recipe is applied from the page itself, so that the two cannot drift apart: each
``kafka-acls.sh --add`` command of its ``sh`` blocks is read as the tool reads its
arguments (``org.apache.kafka.tools.AclCommand``: every operation on every resource of
the command, or the bindings of ``--producer``/``--consumer``) into ACL bindings, which
the admin creates through the Admin API. (The tool itself is in ``kafka-tools``, a jar
the dev stack's broker does not need and does not fetch.) Then real clients, with each
user's credentials, do what the page says each may do, and are refused the rest.
"""

from __future__ import annotations

import re
import shlex
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from confluent_kafka.cimpl import NewTopic

from redrive import App, Message, Service
from redrive.deadlines import Deadline
from redrive.local.kafka import LocalKafka
from redrive.local.security import LocalSecurity
from redrive.ports import free_port
from redrive.topic_names import (
    REQUESTS_TOPIC,
    dead_letter_topic,
    held_keys_topic,
    per_group_retry_topic,
    single_retry_topic,
    tier_topic,
)
from tests.integration.consumer_harness import Calls, retry_service, running_app
from tests.integration.service_harness import now_ms, request_headers

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "kafka-acls.md"

GROUP = "billing"
SOURCE = "orders"
SERVICE_GROUP = "redrive-service"
TIER = tier_topic(GROUP, SOURCE, "5m")
SINGLE = single_retry_topic(GROUP, SOURCE)
PER_GROUP = per_group_retry_topic(GROUP, SOURCE)
HELD = held_keys_topic(GROUP, SOURCE)
SOURCE_DLQ = dead_letter_topic(SOURCE)
SERVICE_DLQ = "redrive.dlq"

USERS = ("billing", "redrive", "mallory")
PLAYED_BY = {"User:shop": "User:mallory"}
"""The page's principals the test's users stand for, where their names differ."""

REFUSED_TOPIC = KafkaError.TOPIC_AUTHORIZATION_FAILED
REFUSED_GROUP = KafkaError.GROUP_AUTHORIZATION_FAILED


# --- the page's commands, read as kafka-acls.sh reads them -------------------------------


@dataclass(frozen=True, order=True)
class Rule:
    """One ACL binding: ``principal`` is allowed ``operation`` on a resource."""

    kind: str
    """A ResourceType's name: TOPIC, GROUP, TRANSACTIONAL_ID, BROKER (the cluster)."""
    name: str
    pattern: str
    """LITERAL or PREFIXED."""
    principal: str
    host: str
    operation: str
    """An AclOperation's name: READ, WRITE, DESCRIBE_CONFIGS..."""

    def binding(self) -> AclBinding:
        return AclBinding(
            ResourceType[self.kind],
            self.name,
            ResourcePatternType[self.pattern],
            self.principal,
            self.host,
            AclOperation[self.operation],
            AclPermissionType.ALLOW,
        )

    @classmethod
    def of(cls, binding: AclBinding) -> Rule:
        assert binding.permission_type == AclPermissionType.ALLOW, binding
        return cls(
            binding.restype.name,
            binding.name,
            binding.resource_pattern_type.name,
            binding.principal,
            binding.host,
            binding.operation.name,
        )


CLUSTER = ("BROKER", "kafka-cluster", "LITERAL")
SUPPORTED = {
    # org.apache.kafka.security.authorizer.AclEntry.supportedOperations, and ALL.
    "TOPIC": {
        "READ",
        "WRITE",
        "CREATE",
        "DESCRIBE",
        "DELETE",
        "ALTER",
        "DESCRIBE_CONFIGS",
        "ALTER_CONFIGS",
        "ALL",
    },
    "GROUP": {"READ", "DESCRIBE", "DELETE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "ALL"},
    "BROKER": {
        "CREATE",
        "CLUSTER_ACTION",
        "DESCRIBE_CONFIGS",
        "ALTER_CONFIGS",
        "IDEMPOTENT_WRITE",
        "ALTER",
        "DESCRIBE",
        "ALL",
    },
    "TRANSACTIONAL_ID": {"DESCRIBE", "WRITE", "ALL"},
}
VALUED = {
    "bootstrap-server",
    "command-config",
    "allow-principal",
    "allow-host",
    "operation",
    "topic",
    "group",
    "transactional-id",
    "resource-pattern-type",
}
FLAGS = {"add", "cluster", "producer", "consumer", "idempotent", "force"}
"""What the recipe may say; anything else (--remove, --deny-principal...) is refused,
so that the page cannot hold a rule this test does not apply."""


def operation_named(name: str) -> str:
    """An operation as the tool names it (``DescribeConfigs``; or ``DESCRIBECONFIGS``)."""
    snake = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name).upper()
    if snake in AclOperation.__members__:
        return snake
    for member in AclOperation.__members__:
        if member.replace("_", "") == name.upper():
            return member
    raise ValueError(f"kafka-acls.sh knows no operation {name!r}")


def command_rules(args: Sequence[str]) -> set[Rule]:
    """The bindings ``kafka-acls.sh <args>`` adds."""
    given: dict[str, list[str]] = {}
    flags: set[str] = set()
    items = list(args)
    while items:
        item = items.pop(0)
        if not item.startswith("--"):
            raise ValueError(f"kafka-acls.sh: {item!r} is not an option")
        option, equals, value = item[2:].partition("=")
        if option in FLAGS and not equals:
            flags.add(option)
        elif option in VALUED:
            if not equals:
                if not items:
                    raise ValueError(f"kafka-acls.sh: --{option} needs a value")
                value = items.pop(0)
            given.setdefault(option, []).append(value)
        else:
            raise ValueError(f"kafka-acls.sh --{option}: not an option the recipe may use")
    if "add" not in flags or "bootstrap-server" not in given:
        raise ValueError(f"kafka-acls.sh {' '.join(args)}: the recipe's commands --add")
    [pattern] = [p.upper() for p in given.get("resource-pattern-type", ["literal"])]
    if pattern not in ("LITERAL", "PREFIXED"):
        raise ValueError(f"--resource-pattern-type {pattern.lower()}: not one to add")
    resources = {("TOPIC", t, pattern) for t in given.get("topic", [])}
    resources |= {("GROUP", g, pattern) for g in given.get("group", [])}
    resources |= {("TRANSACTIONAL_ID", t, pattern) for t in given.get("transactional-id", [])}
    if pattern == "LITERAL" and flags & {"cluster", "idempotent"}:
        resources.add(CLUSTER)
    if not resources:
        raise ValueError(f"kafka-acls.sh {' '.join(args)}: no resource")
    principals = given.get("allow-principal", [])
    hosts = given.get("allow-host", ["*"])
    if not principals:
        raise ValueError(f"kafka-acls.sh {' '.join(args)}: no --allow-principal")
    operations: dict[tuple[str, str, str], set[str]] = {}
    if not flags & {"producer", "consumer"}:
        chosen = {operation_named(o) for o in given.get("operation", ["All"])}
        operations = {resource: chosen for resource in resources}
    if "producer" in flags:
        for resource in resources:
            if resource[0] == "TOPIC":
                operations[resource] = {"WRITE", "DESCRIBE", "CREATE"}
            elif resource[0] == "TRANSACTIONAL_ID":
                operations[resource] = {"WRITE", "DESCRIBE"}
        if "idempotent" in flags:
            operations[CLUSTER] = {"IDEMPOTENT_WRITE"}
    if "consumer" in flags:
        for resource in resources:
            wanted = {"TOPIC": {"READ", "DESCRIBE"}, "GROUP": {"READ"}}.get(resource[0], set())
            operations[resource] = operations.get(resource, set()) | wanted
    rules = set()
    for (kind, name, pattern_of), chosen in operations.items():
        unsupported = chosen - SUPPORTED[kind]
        if unsupported:
            raise ValueError(f"{kind} {name}: kafka-acls.sh refuses {sorted(unsupported)}")
        for principal in principals:
            for host in hosts:
                rules |= {Rule(kind, name, pattern_of, principal, host, op) for op in chosen}
    return rules


def page_commands(text: str) -> list[list[str]]:
    """Every command of the page's ``sh`` blocks, as its arguments (comments dropped,
    continued lines joined); each must be ``kafka-acls.sh``."""
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE):
        joined = re.sub(r"\\\n", " ", block)
        for line in joined.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            words = shlex.split(line)
            assert words[0] == "kafka-acls.sh", f"not a kafka-acls.sh command: {line}"
            commands.append(words[1:])
    return commands


def recipe_rules() -> set[Rule]:
    """The page's rules, the principals the test's users play named as theirs."""
    rules: set[Rule] = set()
    for args in page_commands(DOC.read_text()):
        rules |= command_rules(args)
    return {
        Rule(
            r.kind, r.name, r.pattern, PLAYED_BY.get(r.principal, r.principal), r.host, r.operation
        )
        for r in rules
    }


# --- the broker, the recipe on it, clients of each user ----------------------------------


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A broker of this module's own: SASL/SCRAM over TLS and the StandardAuthorizer."""
    root = tmp_path_factory.mktemp("acls")
    security = LocalSecurity(root / "tls", username="admin", users=USERS, authorizer=True)
    broker = LocalKafka(root / "kafka", free_port(), free_port(), security=security)
    try:
        broker.start(quiet=True)
        yield broker
    finally:
        broker.stop()


def wait_for(check: Callable[[], bool], what: str, seconds: float = 30) -> None:
    deadline = Deadline(seconds)
    while not check():
        if deadline.passed():
            raise AssertionError(f"{what}: not within {deadline.describe()}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def recipe(acl_broker: LocalKafka) -> set[Rule]:
    """The page's ACLs, created by the admin, and the topics the checks write (the
    Apps' own are created by the Apps under their grants)."""
    admin = AdminClient(acl_broker.client_config())
    rules = recipe_rules()
    for future in admin.create_acls([r.binding() for r in sorted(rules)]).values():
        future.result(30)
    topics = [
        NewTopic(SOURCE, 1),
        NewTopic(REQUESTS_TOPIC, 1),
        NewTopic(TIER, 1),
        NewTopic(SINGLE, 1),
        NewTopic(PER_GROUP, 1),
        NewTopic(HELD, 1, config={"cleanup.policy": "compact"}),
    ]
    for future in admin.create_topics(topics).values():
        future.result(30)
    names = {t.topic for t in topics}
    wait_for(lambda: names <= set(admin.list_topics(timeout=10).topics), "the topics")
    # Each principal's clients meet the rules once the broker applied them all.
    wait_for(lambda: held_rules(acl_broker) == rules, "the ACLs in force")
    return rules


def held_rules(broker: LocalKafka) -> set[Rule]:
    admin = AdminClient(broker.client_config())
    everything = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        None,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    return {Rule.of(b) for b in admin.describe_acls(everything).result(30)}


def client(broker: LocalKafka, user: str) -> dict[str, Any]:
    return {**broker.client_config(user=user), "socket.timeout.ms": 10_000}


def produce(
    broker: LocalKafka,
    user: str,
    topic: str,
    *,
    key: bytes | None = None,
    value: bytes | None = b"v",
    headers: list[tuple[str, bytes]] | None = None,
) -> KafkaError | None:
    """Produce one record as ``user``: None once the broker has it, else its error."""
    outcome: list[KafkaError | None] = []
    producer = Producer({**client(broker, user), "message.timeout.ms": 15_000, "linger.ms": 0})
    producer.produce(
        topic,
        key=key,
        value=value,
        headers=headers,
        on_delivery=lambda err, _msg: outcome.append(err),
    )
    deadline = Deadline(30)
    while not outcome and not deadline.passed():
        producer.poll(0.1)
    assert outcome, f"no delivery report for {topic} within {deadline.describe()}"
    return outcome[0]


@dataclass
class Read:
    keys: list[bytes | None]
    values: list[bytes | None]
    errors: set[int]


def read(broker: LocalKafka, user: str, group: str, topic: str) -> Read:
    """Read ``topic``'s partition 0 from its start to its end as ``user`` in ``group``
    (assigned, never committed); stops at a refusal of the topic or the group."""
    found = Read([], [], set())
    consumer = Consumer(
        {
            **client(broker, user),
            "group.id": group,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 50,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = Deadline(30)
        while not deadline.passed():
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            error = msg.error()
            if error is None:
                found.keys.append(msg.key())
                found.values.append(msg.value())
                continue
            if error.code() == KafkaError._PARTITION_EOF:
                return found
            found.errors.add(error.code())
            if error.code() in (REFUSED_TOPIC, REFUSED_GROUP):
                return found
        raise AssertionError(f"{topic} not read to its end within {deadline.describe()}")
    finally:
        consumer.close()


def marker() -> bytes:
    return f"m-{uuid.uuid4().hex[:12]}".encode()


def forged_retry() -> list[tuple[str, bytes]]:
    """The headers of a retry of billing's at attempt 3, as anyone may write them."""
    return [
        (name, value if value is not None else b"")
        for name, value in request_headers(SOURCE, now_ms(), attempt=3, group=GROUP)
    ]


# --- the recipe as the broker holds it -----------------------------------------------------


def test_the_broker_holds_the_pages_rules_and_no_others(
    acl_broker: LocalKafka, recipe: set[Rule]
) -> None:
    assert held_rules(acl_broker) == recipe
    principals = {r.principal for r in recipe}
    assert principals == {
        "User:billing",
        "User:reports",
        "User:redrive",
        "User:mallory",
        "User:ops",
    }
    # Billing's Write stops at its tiers' prefix: its per-group topic is the service's.
    billing_writes = {
        (r.name, r.pattern)
        for r in recipe
        if r.principal == "User:billing" and r.operation == "WRITE" and r.kind == "TOPIC"
    }
    assert (f"{GROUP}.{SOURCE}.retry.", "PREFIXED") in billing_writes
    assert not any(PER_GROUP.startswith(n) for n, p in billing_writes if p == "PREFIXED")


def test_the_recipe_reader_reads_as_the_tool_does() -> None:
    args = ["--bootstrap-server", "b", "--add", "--allow-principal", "User:a"]
    assert command_rules([*args, "--consumer", "--topic", "t", "--group", "g"]) == {
        Rule("TOPIC", "t", "LITERAL", "User:a", "*", "READ"),
        Rule("TOPIC", "t", "LITERAL", "User:a", "*", "DESCRIBE"),
        Rule("GROUP", "g", "LITERAL", "User:a", "*", "READ"),
    }
    assert command_rules(
        [*args, "--operation=DescribeConfigs", "--resource-pattern-type", "prefixed", "--topic=a."]
    ) == {Rule("TOPIC", "a.", "PREFIXED", "User:a", "*", "DESCRIBE_CONFIGS")}
    for wrong in (
        [*args, "--operation", "Write", "--group", "g"],  # not an operation of groups
        [*args, "--deny-principal", "User:b", "--topic", "t"],  # not applied by the test
        [*args, "--operation", "Writ", "--topic", "t"],
        ["--bootstrap-server", "b", "--list", "--topic", "t"],
    ):
        with pytest.raises(ValueError):
            command_rules(wrong)


# --- mallory: the producer of the source topic -------------------------------------------


@pytest.mark.parametrize(
    "topic", [TIER, SINGLE, PER_GROUP, HELD, REQUESTS_TOPIC, SOURCE_DLQ, SERVICE_DLQ]
)
def test_mallory_cannot_write_what_billing_or_the_service_believes(
    acl_broker: LocalKafka, recipe: set[Rule], topic: str
) -> None:
    error = produce(acl_broker, "mallory", topic, key=b"k", headers=forged_retry())
    assert error is not None and error.code() == REFUSED_TOPIC, error


def test_mallory_can_write_redrive_headers_on_the_source_topic_the_door_keys_close(
    acl_broker: LocalKafka, recipe: set[Rule]
) -> None:
    assert produce(acl_broker, "mallory", SOURCE, key=b"k", headers=forged_retry()) is None


def test_mallory_cannot_see_billings_topics_nor_the_requests_nor_join_their_groups(
    acl_broker: LocalKafka, recipe: set[Rule]
) -> None:
    admin = AdminClient(client(acl_broker, "mallory"))
    for topic in (TIER, SINGLE, PER_GROUP, HELD, REQUESTS_TOPIC):
        error = admin.list_topics(topic, timeout=10).topics[topic].error
        assert error is not None and error.code() == REFUSED_TOPIC, (topic, error)
    for group, topic in ((GROUP, TIER), (SERVICE_GROUP, REQUESTS_TOPIC)):
        got = read(acl_broker, "mallory", group, topic)
        assert got.values == [] and REFUSED_GROUP in got.errors, (group, got)


# --- billing: the App of group billing ------------------------------------------------


def test_billing_writes_its_tiers_its_held_keys_and_its_requests(
    acl_broker: LocalKafka, recipe: set[Rule]
) -> None:
    for topic in (TIER, SINGLE, REQUESTS_TOPIC, SOURCE_DLQ):
        assert produce(acl_broker, "billing", topic, key=b"k", value=marker()) is None, topic
    # (A tombstone: held keys are compacted, keyed records; this one frees a key.)
    assert produce(acl_broker, "billing", HELD, key=marker(), value=None) is None
    # Not its source, not the per-group topic (the service's), not the service's mirror.
    for topic in (SOURCE, PER_GROUP, SERVICE_DLQ):
        error = produce(acl_broker, "billing", topic, key=b"k", value=marker())
        assert error is not None and error.code() == REFUSED_TOPIC, (topic, error)


def test_billing_reads_its_tiers_its_held_keys_and_its_per_group_topic(
    acl_broker: LocalKafka, recipe: set[Rule]
) -> None:
    tiered, held, redelivered = marker(), marker(), marker()
    assert produce(acl_broker, "billing", TIER, key=b"k", value=tiered) is None
    assert produce(acl_broker, "billing", HELD, key=held, value=None) is None
    assert produce(acl_broker, "redrive", PER_GROUP, key=b"k", value=redelivered) is None
    tier = read(acl_broker, "billing", GROUP, TIER)
    assert tiered in tier.values and not tier.errors, tier.errors
    # The App reads its held keys back in a group it names only to find a coordinator.
    keys = read(acl_broker, "billing", "redrive-held-keys-reader", HELD)
    assert held in keys.keys and not keys.errors, keys.errors
    retries = read(acl_broker, "billing", GROUP, PER_GROUP)
    assert redelivered in retries.values and not retries.errors, retries.errors
    # Every group's failed payloads are the service's to read, in the service's group.
    requests = read(acl_broker, "billing", GROUP, REQUESTS_TOPIC)
    assert requests.values == [] and REFUSED_TOPIC in requests.errors
    assert REFUSED_GROUP in read(acl_broker, "billing", SERVICE_GROUP, TIER).errors


# --- redrive: the retry service -------------------------------------------------------


def test_redrive_reads_the_requests_and_writes_the_per_group_and_source_topics(
    acl_broker: LocalKafka, recipe: set[Rule]
) -> None:
    request = marker()
    assert produce(acl_broker, "billing", REQUESTS_TOPIC, key=b"k", value=request) is None
    requests = read(acl_broker, "redrive", SERVICE_GROUP, REQUESTS_TOPIC)
    assert request in requests.values and not requests.errors, requests.errors
    for topic in (PER_GROUP, SOURCE):
        assert produce(acl_broker, "redrive", topic, key=b"k", value=marker()) is None, topic
    # Nothing of what billing alone writes.
    for topic in (TIER, SINGLE, HELD):
        error = produce(acl_broker, "redrive", topic, key=b"k", value=marker())
        assert error is not None and error.code() == REFUSED_TOPIC, (topic, error)
    assert REFUSED_GROUP in read(acl_broker, "redrive", GROUP, PER_GROUP).errors


# --- the App and the service themselves, on their grants alone ---------------------------


def credentials(broker: LocalKafka, user: str) -> dict[str, str]:
    return {k: v for k, v in broker.client_config(user=user).items() if k != "bootstrap.servers"}


def test_billings_app_runs_on_its_grants_with_tier_topics(
    acl_broker: LocalKafka, recipe: set[Rule]
) -> None:
    """It creates its tier and dead-letter topics, reads its source and its tier."""
    value = marker()
    calls = Calls()

    def handler(message: Message) -> None:
        calls.add(message)
        if message.value == value and message.attempt == 1:
            raise TimeoutError("first try fails")

    app = App(acl_broker.bootstrap, group=GROUP, kafka=credentials(acl_broker, "billing"))
    app.add_handler(SOURCE, handler, policy="300ms", strategy="topics")
    with running_app(app):
        assert produce(acl_broker, "mallory", SOURCE, key=b"k", value=value) is None
        assert calls.wait_for(lambda: len(calls.of(value)) >= 2, 30)
    assert [c.attempt for c in calls.of(value)] == [1, 2]
    assert app.routes[SOURCE].tiers == {300: tier_topic(GROUP, SOURCE, "300ms")}


def test_the_service_and_billings_app_run_on_their_grants_with_key_order(
    acl_broker: LocalKafka, recipe: set[Rule], database_url: str
) -> None:
    """The service creates its mirror, checks and reads its group; the App hands off in
    transactions, keeps its held keys, and reads its retry back on its per-group topic."""
    value = marker()
    calls = Calls()

    def handler(message: Message) -> None:
        calls.add(message)
        if message.value == value and message.attempt == 1:
            raise TimeoutError("first try fails")

    with retry_service(
        acl_broker.bootstrap,
        database_url,
        kafka=credentials(acl_broker, "redrive"),
        requests_topic=REQUESTS_TOPIC,
        group_id=SERVICE_GROUP,
        allowed_destinations=[SOURCE],
        mirror_dead_letters=True,
    ):
        app = App(
            acl_broker.bootstrap,
            group=GROUP,
            kafka=credentials(acl_broker, "billing"),
            transactional=True,
        )
        app.add_handler(SOURCE, handler, policy="300ms x3", strategy=Service(ordering="key"))
        with running_app(app):
            assert produce(acl_broker, "mallory", SOURCE, key=b"k", value=value) is None
            assert calls.wait_for(lambda: len(calls.of(value)) >= 2, 30)
    assert [(c.attempt, c.topic) for c in calls.of(value)] == [(1, SOURCE), (2, PER_GROUP)]
