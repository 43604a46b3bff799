"""The daemon: wires settings, NATS, PostgreSQL, HTTP and the background loops into one lifecycle.

Start order: HTTP first (so `/healthz` answers while we connect), then the embedded servers if
asked, NATS, migrations, the PostgreSQL pool, provisioning, and the loops. Every component
registers its own cleanup on one AsyncExitStack; `stop()` only signals, and shutdown is bounded
by `SCHEDULER_SHUTDOWN_GRACE`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from scheduler import __version__, migrate
from scheduler.api.app import Served, build_api, build_metrics_app, serve
from scheduler.bus.nats import NatsBus, ProvisionNote, provision
from scheduler.clock import Clock, SystemClock
from scheduler.embedded import NatsServer, Postgres
from scheduler.engine.delayed import DelayedEngine
from scheduler.engine.office import FixedOffice, Office, take_office
from scheduler.engine.recurring import CronEngine
from scheduler.errors import ConfigError
from scheduler.metrics import Metrics
from scheduler.service import SchedulerService
from scheduler.settings import Settings
from scheduler.store.postgres import PostgresStore, create_pool
from scheduler.store.schedules import ScheduleStore
from scheduler.store.tasks import TaskStore

log = logging.getLogger("scheduler.daemon")

UPKEEP_INTERVAL = 3600.0


class RunState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass
class Endpoints:
    """Where this daemon's parts listen, for the start banner and for tests."""

    nats_url: str = ""
    database_url: str = ""
    api: Served | None = None
    metrics: Served | None = None
    embedded: list[str] = field(default_factory=list)


class Daemon:
    """One scheduler instance."""

    def __init__(
        self,
        settings: Settings,
        *,
        embedded: bool = False,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.embedded = embedded
        self.clock = clock or SystemClock()
        self.metrics = metrics or Metrics()
        self.state = RunState.STARTING
        self.endpoints = Endpoints()
        self.bus: NatsBus | None = None
        self.store: PostgresStore | None = None
        self.tasks: TaskStore | None = None
        self.office: Office | None = None
        self.engine: DelayedEngine | None = None
        self.cron: CronEngine | None = None
        self.provisioned: list[ProvisionNote] = []
        self.warnings: list[str] = []
        self.migrated = False
        self.started = asyncio.Event()
        self._stop = asyncio.Event()
        self.metrics.info.labels(__version__, settings.instance_id).set(1)

    # -- lifecycle --------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the daemon to shut down; returns at once."""
        self._stop.set()

    def reload(self) -> None:
        """Re-read the schedules YAML (SIGHUP)."""
        if self.cron is not None:
            self.cron.request_reload()

    async def run(self) -> None:
        """Run until `stop()`; everything started is torn down on the way out."""
        try:
            async with AsyncExitStack() as stack:
                await self._start(stack)
                self.state = RunState.RUNNING
                self.started.set()
                log.info("daemon.running instance=%s", self.settings.instance_id)
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._upkeep_loop(), name="fire-log-upkeep")
                    tg.create_task(self._engine_loop(), name="engine")
                    tg.create_task(self._lag_probe(), name="loop-lag")
                    tg.create_task(self._stop.wait(), name="stop-signal")
                self.state = RunState.STOPPING
                log.info("daemon.stopping")
        finally:
            self.state = RunState.STOPPED
            log.info("daemon.stopped")

    async def _start(self, stack: AsyncExitStack) -> None:
        s = self.settings
        api = await serve(build_api(self), s.http_host, s.http_port)
        stack.push_async_callback(api.close)
        metrics = await serve(build_metrics_app(self.metrics), s.http_host, s.metrics_port)
        stack.push_async_callback(metrics.close)
        self.endpoints.api, self.endpoints.metrics = api, metrics
        s = await self._start_embedded(stack)
        self.bus = NatsBus(s, self.metrics)
        await self.bus.connect()
        stack.push_async_callback(self.bus.close)
        self._check_server_version()
        dsn = s.database_dsn
        assert dsn is not None
        await migrate.upgrade_async(dsn)
        self.migrated = True
        self.store = PostgresStore(await create_pool(dsn), self.metrics)
        stack.push_async_callback(self.store.close)
        self.metrics.connected.labels("postgres").set(1)
        if s.provision:
            self.provisioned = await provision(self.bus, embedded=self.embedded)
        self.settings = s
        self.tasks = TaskStore(self.store)
        service = SchedulerService(self.bus.nc, s, self.tasks, self.clock, self.stats)
        await service.start()
        stack.push_async_callback(service.stop)
        self.office = FixedOffice(await take_office(self.store.pool, s.instance_id))
        self.metrics.is_leader.set(1)
        self.metrics.leader_epoch.set(self.office.epoch or 0)
        self.cron = CronEngine(
            s, ScheduleStore(self.store), self.office, self.clock, self.metrics, self.bus.js
        )
        self.engine = DelayedEngine(
            s,
            self.bus,
            self.tasks,
            self.office,
            self.clock,
            self.metrics,
            self._intake_stream(),
            self.cron,
        )

    def _intake_stream(self) -> str:
        """The configured intake stream, or the stream found covering the delay lane."""
        for note in self.provisioned:
            if note.kind == "stream" and note.name == self.settings.intake_stream:
                return note.detail if note.status == "covered" else note.name
        return self.settings.intake_stream

    async def _engine_loop(self) -> None:
        """Run terms of office until stopped (one long term for a single instance)."""
        assert self.engine is not None and self.office is not None
        while not self._stop.is_set():
            await self.engine.run_term(self._stop)
            if self.office.lost.is_set():
                await self._wait_stop(self.settings.campaign_interval.total_seconds())

    def stats(self) -> dict[str, Any]:
        """What `scheduler.v1.stats` answers."""
        return {
            "instance": self.settings.instance_id,
            "role": self._role(),
            "epoch": self.office.epoch if self.office else None,
            "heap": len(self.engine.heap) if self.engine else 0,
            "version": __version__,
        }

    def _role(self) -> str:
        return "leader" if self.office is not None and self.office.may_act() else "standby"

    async def _start_embedded(self, stack: AsyncExitStack) -> Settings:
        """Start whichever server has no URL (embedded mode), or fail naming the variable."""
        s = self.settings
        data_dir = s.data_dir
        changes: dict[str, Any] = {}
        if s.nats_url is None:
            if not self.embedded:
                raise ConfigError("SCHEDULER_NATS_URL", "not set (or run with --embedded)")
            server = await asyncio.to_thread(NatsServer(data_dir / "nats").start)
            stack.callback(server.stop)
            changes["nats_url"] = server.url
            self.endpoints.embedded.append("nats")
        if s.database_url is None:
            if not self.embedded:
                raise ConfigError("SCHEDULER_DATABASE_URL", "not set (or run with --embedded)")
            pg = await asyncio.to_thread(Postgres(data_dir / "postgres").start)
            stack.callback(pg.stop)
            changes["database_url"] = pg.url
            self.endpoints.embedded.append("postgres")
        if changes:
            s = s.with_overrides(**changes)
        self.endpoints.nats_url = s.nats_url or ""
        self.endpoints.database_url = s.redacted_database_url or ""
        return s

    def _check_server_version(self) -> None:
        assert self.bus is not None
        problem = self.bus.version_problem()
        log.info("nats.server_version version=%s", self.bus.server_version)
        if problem:
            log.warning("nats.server_too_old %s", problem)
            self.warnings.append(problem)

    async def _upkeep_loop(self) -> None:
        """Hourly: fire-log partitions two days ahead, expired ones dropped, old tasks purged."""
        assert self.store is not None
        while not self._stop.is_set():
            try:
                for change in await self.store.fire_log_upkeep(self.settings.fire_log_retention):
                    log.info("fire_log.partition %s", change)
                if self.tasks is not None:
                    purged = await self.tasks.purge_finished(self.settings.fire_log_retention)
                    log.info("delayed_messages.purged rows=%d", purged)
            except Exception as exc:  # upkeep must never take the daemon down; retried next hour
                log.warning("fire_log.upkeep_failed error=%r", exc)
            await self._wait_stop(UPKEEP_INTERVAL)

    async def _lag_probe(self) -> None:
        """Measure how late the event loop runs a 10 ms timer (CPU starvation shows here first)."""
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            start = loop.time()
            await asyncio.sleep(0.01)
            self.metrics.loop_lag.observe(max(0.0, loop.time() - start - 0.01))

    async def _wait_stop(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)
        except TimeoutError:
            pass

    # -- health -----------------------------------------------------------------------------------
    def is_alive(self) -> bool:
        return self.state in (RunState.STARTING, RunState.RUNNING)

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        nats_ok = self.bus is not None and self.bus.is_connected
        ready = self.state is RunState.RUNNING and nats_ok and self.migrated
        body = {
            "state": self.state.value,
            "role": self._role(),
            "epoch": self.office.epoch if self.office else None,
            "instance": self.settings.instance_id,
            "nats": "connected" if nats_ok else "disconnected",
            "postgres": "migrated" if self.migrated else "pending",
            "warnings": list(self.warnings)
            + (self.cron.errors if self.cron else [])
            + (list(self.engine.warnings.values()) if self.engine else []),
        }
        return ready, body
