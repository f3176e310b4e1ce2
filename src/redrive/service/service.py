"""`redrive serve`: intake, scheduler and the dead-letter store in one process.

The roles run as threads around one PostgreSQL store: intake (requests topic ->
store), scheduler (store -> destinations) with the bulk replay jobs, a LISTEN
connection that wakes the scheduler across instances, and the HTTP server (/metrics,
/healthz, /readyz).
Any number of processes may run against one database; each takes its share.

The service is given its Kafka bootstrap and database URL; `redrive serve` with
none configured starts the local stack (`redrive local`) and passes its addresses:
the embedded default.
"""

from __future__ import annotations

import functools
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import structlog
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from prometheus_client import CollectorRegistry

from redrive import __version__
from redrive.client_logs import with_client_logs
from redrive.errors import ConfigError
from redrive.partitioners import placed_by
from redrive.ports import listener_of, port_in_use
from redrive.requests import IntakeRules
from redrive.service.auth import Tokens
from redrive.service.config import ServiceSettings
from redrive.service.history import history_pruner, identity_pruner
from redrive.service.intake import Intake
from redrive.service.metrics import ServiceMetrics
from redrive.service.notify import listen
from redrive.service.operations import Operations
from redrive.service.replay import Replayer
from redrive.service.replay_jobs import ReplayJobRunner
from redrive.service.scheduler import Scheduler
from redrive.service.store import GroupSurge, Store, StoreUnavailable
from redrive.service.store_guard import StoreGuard
from redrive.service.workers import Workers, WorkersRegistry
from redrive.sizes import producer_size_limit
from redrive.topic_admin import LoginWatch, TopicMetadata, ensure_topic

if TYPE_CHECKING:
    import uvicorn

log = structlog.get_logger("redrive.service")

REQUESTS_TOPIC_PARTITIONS = 6


class RetryService:
    version = __version__

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.failed: BaseException | None = None
        self.bootstrap = ""
        self.database_url = ""
        self.http_port: int | None = None
        self.intake: Intake | None = None
        self.scheduler: Scheduler | None = None
        self.replay_jobs: ReplayJobRunner | None = None
        self._http: uvicorn.Server | None = None
        self.store: Store | None = None
        self._admin: AdminClient | None = None
        self._replay_producer: Producer | None = None
        self.metrics = ServiceMetrics(
            self._pending_by_destination,
            self._oldest_due_ms,
            self.readiness,
            error_group_surges=self._error_group_surges,
        )
        # What /metrics shows: this process's, or all workers' added up (workers.py).
        self.exposed_metrics: CollectorRegistry = self.metrics.registry
        self.workers: Workers | None = None

    def _pending_by_destination(self) -> dict[str, int]:
        return self.store.pending_by_destination() if self.store else {}

    def _oldest_due_ms(self) -> int | None:
        return self.store.oldest_due_ms() if self.store else None

    def _error_group_surges(self, limit: int) -> list[GroupSurge]:
        return self.store.error_group_surges(limit=limit) if self.store else []

    @property
    def kafka_config(self) -> dict[str, Any]:
        # Every client the service makes logs through structlog, not raw on stderr.
        return with_client_logs({"bootstrap.servers": self.bootstrap, **self.settings.kafka})

    def start(self) -> None:
        """Connect, migrate, create topics, start the roles; return once they run.
        If it cannot, what it started is stopped before the error is raised: a program
        that embeds the service is left with no thread or connection of it."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        s = self.settings
        if s.http_port and port_in_use(s.http_port, s.http_host):
            raise ConfigError(
                f"http_port {s.http_port} (REDRIVE_HTTP_PORT)",
                f"{s.http_host}:{s.http_port} is already in use by {listener_of(s.http_port)}",
                "choose another port, or 0 for any free port",
            )
        if s.bootstrap is None or s.database_url is None:
            setting = "bootstrap" if s.bootstrap is None else "database_url"
            raise ConfigError(
                f"{setting} (REDRIVE_{setting.upper()})",
                "not set: the service needs a Kafka cluster and a PostgreSQL database",
                "set it; `redrive serve` without it uses the local stack (redrive local)",
            )
        self.bootstrap, self.database_url = s.bootstrap, s.database_url
        self.store = Store(
            self.database_url,
            reconnect_max_s=s.store_retry_max_seconds,
            claim_timeout_s=s.lease_seconds,
            keep_history=s.history_retention_days > 0,
            quarantine_after_replays=s.quarantine_after_replays,
        )
        try:
            self.store.open()
        except Exception as exc:  # noqa: BLE001 - any start-up failure reads the same way
            raise ConfigError(
                "database_url (REDRIVE_DATABASE_URL)",
                f"cannot open the store: {str(exc).strip()[:300]}",
                "check that PostgreSQL runs and the URL, user and password are right",
            ) from None
        # The topics are made by a client of their own, which reports a refused login
        # at once (LoginWatch); it is polled only here, so its error callback cannot
        # pile up errors for the rest of the service's life.
        login = LoginWatch()
        setup_config: dict[str, Any] = {**self.kafka_config, "error_cb": login}
        setup = AdminClient(setup_config)
        try:
            ensure_topic(setup, s.requests_topic, REQUESTS_TOPIC_PARTITIONS, {}, login=login)
            if s.mirror_dead_letters:
                ensure_topic(setup, s.dlq_topic, 1, {}, login=login)
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(
                "bootstrap (REDRIVE_BOOTSTRAP)",
                f"cannot create or check topic {s.requests_topic!r}: {exc}",
                "check that the broker is reachable and the kafka settings are right",
            ) from None
        guard = None
        if "intake" in s.roles:
            # Before any role starts: a service on another store than the one its
            # requests group reads into stops here, without joining the group.
            guard = StoreGuard(
                s,
                self.store.store_id(),
                _redact(self.database_url),
                self.stop_event,
                self.kafka_config,
            )
            guard.check()
        admin = self._admin = AdminClient(self.kafka_config)
        metadata = TopicMetadata(admin)
        self.operations = Operations(self.store)
        self.tokens = Tokens(self.store)
        # Every producer of the service (scheduler, replays, replay jobs, the mirror)
        # is made from this: one size limit, one placement by key.
        producer_config = {
            **self.kafka_config,
            **self._producer_limit(admin),
            **placed_by(s.partitioner),
        }
        self._replay_producer = Producer({**producer_config, "enable.idempotence": True})
        self.replayer = Replayer(
            self._replay_producer, s.destination_allowed, metadata.partitions_of
        )
        if s.allowed_destinations == ["*"]:
            log.warning(
                "no destination allowlist configured: requests may target any topic "
                "but internal ones; set allowed_destinations"
            )
        if "scheduler" in s.roles:
            # (scheduler_kafka, applied by the scheduler over this, still wins.)
            self.scheduler = Scheduler(
                s, producer_config, self.store, self.metrics, self.stop_event
            )
            self._spawn("scheduler", self.scheduler.run)
            self._spawn("notify", lambda: listen(self.database_url, self._wake, self.stop_event))
            # Bulk replays send to the destinations too: they run where the scheduler does.
            self.replay_jobs = ReplayJobRunner(
                self.store.replay_jobs,
                self.store.dead_letters_by_id,
                self.replayer,
                kafka_config=self.kafka_config,
                producer_config=producer_config,
                transactional_prefix=f"redrive.{s.group_id}.replay-job-",
                audit=self.operations.audit,
                stop_event=self.stop_event,
            )
            self._spawn("replay-jobs", self.replay_jobs.run)
            if s.history_retention_days > 0:
                history = history_pruner(
                    self.store, s.history_retention_days * 86_400, self.stop_event
                )
                self._spawn("history", history.run)
            identities = identity_pruner(self.store, s.repeat_window_days * 86_400, self.stop_event)
            self._spawn("identities", identities.run)
        if guard is not None:
            rules = IntakeRules(
                # Settings are fixed for the process: each destination is matched once.
                destination_allowed=functools.lru_cache(maxsize=4096)(s.destination_allowed),
                partitions_of=metadata.partitions_of,
                max_delay_ms=int(s.max_delay_days * 86_400_000),
                signatures=s.signature_check(),
            )
            self.intake = Intake(
                s,
                self.kafka_config,
                self.store,
                rules,
                self.metrics,
                self.stop_event,
                guard,
                on_scheduled=self._wake,
                producer_config=producer_config,
            )
            self._spawn("intake", self.intake.run)
        if s.workers > 1:
            self._start_workers()
        self._start_http()
        log.info(
            "redrive serve started",
            bootstrap=self.bootstrap,
            database=_redact(self.database_url),
            roles=list(s.roles),
            http=f"http://{s.http_host}:{self.http_port}",
            group_instance_id=s.group_instance_id() if "intake" in s.roles else None,
            producer_max_message_bytes=producer_config.get("message.max.bytes"),
            partitioner=s.partitioner.value,
        )

    def _start_workers(self) -> None:
        # After this process migrated the store and made the topics: the others find
        # both done. They start side by side; a failure to start stops this one too.
        self.workers = Workers(self.settings, self.settings.workers)
        try:
            self.workers.start()
        except BaseException:
            self.workers = None
            self.stop()
            raise
        self.exposed_metrics = WorkersRegistry(self.metrics.registry, self.workers)

    def _producer_limit(self, admin: AdminClient) -> dict[str, Any]:
        """`message.max.bytes` for the scheduler's, replays' and mirror's producers:
        whatever intake can receive the service can send (see redrive.sizes). Nothing
        if the `kafka` setting names it (then it wins)."""
        if "message.max.bytes" in self.settings.kafka:
            return {}
        return producer_size_limit(admin, [self.settings.requests_topic])

    def wake_scheduler(self) -> None:
        self._wake(0)

    def wake_replay_jobs(self) -> None:
        if self.replay_jobs is not None:
            self.replay_jobs.wake()

    def _wake(self, due_ms: int) -> None:
        if self.scheduler is not None:
            self.scheduler.wake(due_ms)

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        def run() -> None:
            try:
                target()
            except ConfigError as exc:  # a setting proved wrong while running (instance_id)
                self.failed = exc
                log.error(
                    "a setting is wrong; stopping the service",
                    role=name,
                    setting=exc.setting,
                    problem=exc.problem,
                    fix=exc.fix,
                )
                self.stop_event.set()
            except BaseException as exc:  # a role died: stop the whole service, loudly
                self.failed = exc
                log.exception("role crashed; stopping the service", role=name)
                self.stop_event.set()

        thread = threading.Thread(target=run, name=f"redrive-{name}", daemon=True)
        thread.start()
        self.threads.append(thread)

    def _start_http(self) -> None:
        # Imported here, after the roles started: the web stack takes a few hundred ms
        # to import, which a restarted instance need not wait for to deliver again.
        import uvicorn

        from redrive.service.web import create_app

        s = self.settings
        config = uvicorn.Config(
            create_app(self),
            host=s.http_host,
            port=s.http_port,
            log_level="warning",
            access_log=False,
        )
        self._http = uvicorn.Server(config)
        thread = threading.Thread(target=self._http.run, name="redrive-http", daemon=True)
        thread.start()
        while not self._http.started and thread.is_alive():
            time.sleep(0.02)
        if not self._http.started:
            raise ConfigError(f"http_port {s.http_port}", "the HTTP server did not start")
        sockets = self._http.servers[0].sockets if self._http.servers else []
        self.http_port = sockets[0].getsockname()[1] if sockets else s.http_port

    def readiness(self) -> dict[str, bool]:
        checks = {"store": bool(self.store and self.store.ping())}
        if self.intake is not None:
            checks["intake"] = self.intake.healthy
        if self.scheduler is not None:
            checks["scheduler"] = self.scheduler.healthy
        if self.replay_jobs is not None:
            checks["replay_jobs"] = self.replay_jobs.healthy
        checks["running"] = not self.stop_event.is_set()
        return checks

    def stop(self, timeout: float = 30.0) -> None:
        self.stop_event.set()
        if self.workers is not None:
            self.workers.stop(timeout)
        if self.scheduler is not None:
            self.scheduler.wake(0)
        for thread in self.threads:
            thread.join(timeout)
        if self._http is not None:
            self._http.should_exit = True
        if self.store is not None:
            self.store.close()
        if self._replay_producer is not None:
            self._replay_producer.flush(10)
            self._replay_producer.close()
            self._replay_producer = None
        # Drop the Kafka clients now rather than whenever the service object goes.
        self.intake = None
        self.scheduler = None
        self.replay_jobs = None
        self._admin = None
        self.replayer = None  # type: ignore[assignment]  # holds the metadata admin client

    def run_until_signal(self) -> int:
        """Run until SIGTERM or SIGINT (or a role crashed); exit code for the process."""

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("signal received; stopping", signal=signal.Signals(signum).name)
            self.stop_event.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        while not self.stop_event.wait(0.5):
            ended = self.workers.ended() if self.workers is not None else None
            if ended is not None:
                index, code = ended
                log.error("a worker ended; stopping the service", worker=index, exit_code=code)
                self.failed = RuntimeError(f"worker {index} ended with exit code {code}")
                break
        self.stop()
        if isinstance(self.failed, ConfigError):
            raise self.failed  # the command line prints it, naming the setting (exit 2)
        return 1 if self.failed else 0


def _redact(url: str) -> str:
    """A database URL without its password, for logs."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


__all__ = ["RetryService", "StoreUnavailable"]
