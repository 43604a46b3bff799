"""The daemon: wires settings, NATS, PostgreSQL, HTTP and the background loops into one lifecycle.

Start order: HTTP first (so `/healthz` answers while we connect; `listeners`; the management API
itself is built in a worker thread meanwhile and swapped in before the daemon reports itself
running: `scheduler.api.starting`), then the embedded servers if asked
(`embedded.start_missing`), NATS, migrations, the PostgreSQL pool, provisioning (with the
checks of `preflight`), and the loops: leadership, the role loop
(`terms.TermLoop`), housekeeping (`upkeep`). Every component registers its own cleanup on one
AsyncExitStack; `stop()` only signals, and shutdown is bounded by `SCHEDULER_SHUTDOWN_GRACE`. A
stop during the start abandons it at once (whatever phase it is in) and unwinds what was
started; `stopped_during_start` then names the phase. What the daemon answers about itself
(readiness, stats, the leader) is at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import gc
import logging
import threading
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from nats.js.errors import NotFoundError

from scheduler import __version__
from scheduler.aio import first_of
from scheduler.api.nats_service import SchedulerService
from scheduler.api.server import Served
from scheduler.api.starting import MetricsApp, StartingApp
from scheduler.bus.nats.connection import NatsBus, ProvisionNote, lane_window_warning, provision
from scheduler.clock import Clock, SystemClock
from scheduler.daemon import migrate
from scheduler.daemon.embedded import start_missing
from scheduler.daemon.listeners import api_imported, build_api_app, listen
from scheduler.daemon.preflight import check_api_exposure, check_lease_bucket, check_server_version
from scheduler.daemon.upkeep import (
    activity_upkeep,
    dead_letter_upkeep,
    fire_log_upkeep,
    loop_lag_probe,
)
from scheduler.engine.cron.firing import CronEngine
from scheduler.engine.leader_loop import LeaderEngine
from scheduler.engine.office import Office
from scheduler.errors import ServiceUnavailableError
from scheduler.leadership.election import Leadership
from scheduler.leadership.skew import ClockCheck
from scheduler.leadership.terms import TermLoop
from scheduler.metrics import Metrics
from scheduler.operations import paging
from scheduler.operations.build import Operations, build_operations
from scheduler.operations.instances import read_instances
from scheduler.operations.stats import Refresher
from scheduler.settings import Settings
from scheduler.store.postgres.connect import PostgresStore, create_pool
from scheduler.store.postgres.cron_jobs import ScheduleStore
from scheduler.store.postgres.dead_letters import DeadLetterStore
from scheduler.store.postgres.epoch import database_time
from scheduler.store.postgres.intents import IntentLimits
from scheduler.store.postgres.task_admin import TaskAdmin
from scheduler.store.postgres.tasks import TaskStore

log = logging.getLogger(__name__)


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
        self.store: PostgresStore | None = None  # the engine's pool (and the NATS service's)
        self.api_store: PostgresStore | None = None  # the management API's own pool
        self.tasks: TaskStore | None = None
        self.office: Office | None = None
        self.leadership: Leadership | None = None
        self.clock_check: ClockCheck | None = None
        self.state_kv: Any = None
        self.engine: LeaderEngine | None = None
        self.cron: CronEngine | None = None
        self.operations: Operations | None = None  # what the management API calls
        self.refresher: Refresher | None = None
        self.provisioned: list[ProvisionNote] = []
        self.warnings: list[str] = []
        self.migrated = False
        self.phase = "starting"
        self.stopped_during_start: str | None = None
        self.started = asyncio.Event()
        self.http_app = StartingApp(self)  # the API port's app; the full API once built
        self._api_build: asyncio.Future[Any] | None = None
        self._stop = asyncio.Event()
        self._done_leading = asyncio.Event()  # set once the engine ended and the lease is given up
        self.metrics.daemon_started(__version__, settings.instance_id)

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
                if not await self._start_unless_stopped(stack):
                    return
                assert self.leadership is not None and self.store is not None
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self.leadership.run(self._done_leading), name="leadership")
                    tg.create_task(
                        self.leadership.heartbeat(self.state_kv, self._done_leading),
                        name="heartbeat",
                    )
                    assert self.operations is not None
                    ops = self.operations
                    upkeep = fire_log_upkeep(
                        self.store,
                        self.tasks,
                        self.settings,
                        self._stop,
                        lambda: ops.idempotency.prune(self.clock.now()),
                    )
                    tg.create_task(upkeep, name="fire-log-upkeep")
                    dead = DeadLetterStore(self.store)
                    pruning = dead_letter_upkeep(
                        dead, self.settings, self.clock, self.metrics, self._stop
                    )
                    tg.create_task(pruning, name="dead-letter-upkeep")
                    pruned = activity_upkeep(ops.activity, self.settings, self.metrics, self._stop)
                    tg.create_task(pruned, name="activity-upkeep")
                    tg.create_task(ops.backlog.run(self._stop), name="write-backlog")
                    tg.create_task(self._term_loop().run(), name="engine")
                    tg.create_task(loop_lag_probe(self.metrics, self._stop), name="loop-lag")
                    assert self.refresher is not None and self.bus is not None
                    assert self.bus.nc is not None
                    tg.create_task(self.refresher.run(self.bus.nc, self._stop), name="refresher")
                    assert self.clock_check is not None
                    tg.create_task(self.clock_check.run(self._done_leading), name="clock-check")
                    tg.create_task(self._stop.wait(), name="stop-signal")
                    await self._serve_api()  # the loops above run (and fire) meanwhile
                    self.state = RunState.RUNNING
                    self.started.set()
                    log.info("daemon.running instance=%s", self.settings.instance_id)
                self.state = RunState.STOPPING
                log.info("daemon.stopping")
        finally:
            self.state = RunState.STOPPED
            log.info("daemon.stopped")

    async def _start_unless_stopped(self, stack: AsyncExitStack) -> bool:
        """Start; a stop requested meanwhile cancels the start at once (False)."""
        start = asyncio.create_task(self._start(stack), name="start")
        try:
            await first_of(asyncio.shield(start), self._stop.wait())
        except asyncio.CancelledError:  # cancelled from outside (a second Ctrl-C)
            start.cancel()
            await asyncio.gather(start, return_exceptions=True)
            raise
        if start.done():
            start.result()
            return True
        start.cancel()
        await asyncio.gather(start, return_exceptions=True)
        self.stopped_during_start = self.phase
        log.info("daemon.start_abandoned phase=%r", self.phase)
        return False

    def _enter(self, phase: str) -> None:
        self.phase = phase
        log.info("daemon.start phase=%r", phase)

    async def _start(self, stack: AsyncExitStack) -> None:
        await self._open_http(stack)
        s = self.settings = await self._start_embedded(stack)
        budget = s.startup_timeout.total_seconds()
        self._enter("connecting to NATS")
        self.bus = NatsBus(s, self.metrics)
        stack.push_async_callback(self.bus.close)
        await self.bus.connect(budget)
        nc = self.bus.nc
        assert nc is not None  # connect() returned: connected
        self._check_server_version()
        self.store = await self._open_postgres(stack, budget)
        self.api_store = await self._open_api_pool(stack, budget)
        self._enter("provisioning streams and buckets")
        leader_kv = await self.bus.setup(self._provision())
        self._enter("starting the service and the lease")
        limits = IntentLimits(s.intent_ttl, s.intent_max_per_target)
        self.tasks = TaskStore(self.store, limits)
        # The NATS service (producers' cancel/reschedule/get) keeps the engine's pool; the
        # management API, the console and the CLI over it run on the API's own pool, writes
        # included, through the same store statements (see docs/operations.md).
        own = build_operations(nc, s, self.store, self.tasks, self.clock, self.leader)
        self.operations = build_operations(
            nc,
            s,
            self.api_store,
            TaskAdmin(self.api_store, limits),
            self.clock,
            self.leader,
        )
        stack.callback(setattr, self, "operations", None)  # API: 503 before the pool closes
        service = SchedulerService(nc, s, own.tasks, self.clock, self.stats)
        await service.start()
        stack.push_async_callback(service.stop)
        self.clock_check = ClockCheck(
            functools.partial(database_time, self.store.pool),
            self.clock,
            s.max_clock_skew.total_seconds(),
            self.metrics,
        )
        await self.clock_check.measure()
        self.leadership = Leadership(
            leader_kv,
            self.store.pool,
            s,
            self.clock,
            self.metrics,
            clock_ok=self.clock_check.ok,
            clock_check=self.clock_check.measure,
        )
        self.office = self.leadership
        self.metrics.standing_by()
        self.cron = CronEngine(
            s, ScheduleStore(self.store), self.office, self.clock, self.metrics, self.bus
        )
        self.engine = LeaderEngine(
            s,
            self.bus,
            self.tasks,
            self.office,
            self.clock,
            self.metrics,
            self._intake_stream(),
            self.cron,
        )
        self.refresher = Refresher(
            s,
            own.stats.overview,
            own.stats.dead_letters,
            ScheduleStore(self.store),
            self.metrics,
            self.clock,
            self.leadership.may_act,
            self._intake_backlog,
            self.cron,
        )

    async def _open_http(self, stack: AsyncExitStack) -> None:
        s = self.settings
        self._enter("opening the HTTP ports")
        self._api_build = self._build_api()
        stack.push_async_callback(self._drop_api_build)
        api = await listen(self.http_app, s, s.http_port, "SCHEDULER_HTTP_PORT", self.embedded)
        stack.push_async_callback(api.close)
        metrics = await listen(
            MetricsApp(self.metrics.render),
            s,
            s.metrics_port,
            "SCHEDULER_METRICS_PORT",
            self.embedded,
        )
        stack.push_async_callback(metrics.close)
        self.endpoints.api, self.endpoints.metrics = api, metrics
        self._warn(check_api_exposure(s))

    def _build_api(self) -> asyncio.Future[Any]:
        """Build the management API in a daemon thread (`scheduler.api.starting`): a stop
        during the start must not wait for its imports, and asyncio.run would wait for a
        thread of the default executor. Once the process has imported it (another daemon
        in the same process, as in the tests), the build takes ~25 ms and is done here: a
        thread would fight the loop for the GIL for a second (a start took 1.2 s, not 0.2)."""
        loop = asyncio.get_running_loop()
        built: asyncio.Future[Any] = loop.create_future()
        if api_imported():
            try:
                built.set_result(build_api_app(self))
            except Exception as exc:  # raised where it is awaited, as from the thread
                built.set_exception(exc)
            return built

        def settle(result: Any, error: BaseException | None) -> None:
            if built.done():  # cancelled: the start was abandoned
                return
            if error is not None:
                built.set_exception(error)
            else:
                built.set_result(result)

        def build() -> None:
            result, error = None, None
            try:
                result = build_api_app(self)
            except BaseException as exc:  # handed to the loop, raised where it is awaited
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(settle, result, error)

        threading.Thread(target=build, name="api-build", daemon=True).start()
        return built

    async def _serve_api(self) -> None:
        """Swap the management API in once its thread has built it."""
        assert self._api_build is not None
        self.http_app.app = await self._api_build

    async def _drop_api_build(self) -> None:
        """At the end (or a failed start): the build's outcome is collected, never left
        pending; a thread still importing finishes by itself."""
        if self._api_build is not None:
            self._api_build.cancel()
            await asyncio.gather(self._api_build, return_exceptions=True)

    async def _start_embedded(self, stack: AsyncExitStack) -> Settings:
        """Start whichever server has no URL (embedded mode), or fail naming the variable."""
        s, started = await start_missing(self.settings, self.embedded, stack, self._enter)
        self.endpoints.embedded += started
        self.endpoints.nats_url = s.redacted_nats_url
        self.endpoints.database_url = s.redacted_database_url or ""
        return s

    def _check_server_version(self) -> None:
        assert self.bus is not None
        self._warn(check_server_version(self.bus, self.settings))

    def _warn(self, warning: str | None) -> None:
        """Keep a start-up check's warning for `/readyz`."""
        if warning is not None:
            self.warnings.append(warning)

    async def _open_postgres(self, stack: AsyncExitStack, budget: float) -> PostgresStore:
        """First contact (retried for `budget` s), migrations, then the pool."""
        dsn = self.settings.database_dsn
        assert dsn is not None
        self._enter("connecting to PostgreSQL")
        await migrate.current_revision(dsn, budget)
        self._enter("migrating the schema")
        await migrate.upgrade_async(dsn, budget=budget)
        self.migrated = True
        self._enter("opening the PostgreSQL pool")
        store = PostgresStore(await create_pool(dsn, budget), self.metrics)
        stack.push_async_callback(store.close)
        self.metrics.postgres_connected()
        return store

    async def _open_api_pool(self, stack: AsyncExitStack, budget: float) -> PostgresStore:
        """The management API's pool: SCHEDULER_API_POOL_SIZE connections whose statements
        PostgreSQL cuts at SCHEDULER_API_STATEMENT_TIMEOUT, so operator reads never hold or
        wait for a connection of the engine's."""
        s = self.settings
        assert s.database_dsn is not None
        timeout = s.api_statement_timeout.total_seconds()
        pool = await create_pool(
            s.database_dsn,
            budget,
            min_size=1,
            max_size=s.api_pool_size,
            statement_timeout=timeout,
        )
        store = PostgresStore(pool, self.metrics, acquire_timeout=timeout)
        stack.push_async_callback(store.close)
        return store

    async def _provision(self) -> Any:
        """Provision (when asked), check the lease bucket, open both buckets; the lease KV."""
        assert self.bus is not None and self.bus.js is not None
        if self.settings.provision:
            self.provisioned = await provision(self.bus, embedded=self.embedded)
        await self._check_lane_window()
        self._warn(await check_lease_bucket(self.bus, self.settings))
        leader_kv = await self.bus.js.key_value(self.settings.leader_bucket)
        self.state_kv = await self.bus.js.key_value(self.settings.state_bucket)
        await paging.load_key(self.state_kv)  # cursors signed alike by every instance
        return leader_kv

    async def _check_lane_window(self) -> None:
        """One warning at start when the delay lane keeps a duplicate window (docs/operations.md,
        "The delay lane's duplicate window"); the lane is checked, never refused: with
        provisioning off an operator may not have updated it yet, and tasks must still flow."""
        assert self.bus is not None
        if self.settings.intake_duplicate_window is not None:
            log.warning(
                "settings.ignored SCHEDULER_INTAKE_DUPLICATE_WINDOW: the delay lane keeps no "
                "duplicate window (nats-server 2.14+) or the shortest one, 100ms"
            )
        try:
            warning = await lane_window_warning(self.bus, self._intake_stream())
        except NotFoundError:
            warning = f"the delay lane's stream {self._intake_stream()} does not exist yet"
        if warning is not None:
            log.warning("nats.lane_duplicate_window %s", warning)
        self._warn(warning)

    def _intake_stream(self) -> str:
        """The configured intake stream, or the stream found covering the delay lane."""
        for note in self.provisioned:
            if note.kind == "stream" and note.name == self.settings.intake_stream:
                return note.detail if note.status == "covered" else note.name
        return self.settings.intake_stream

    def _term_loop(self) -> TermLoop:
        assert self.engine is not None and self.leadership is not None
        grace = self.settings.shutdown_grace.total_seconds()
        return TermLoop(self.engine, self.leadership, grace, self._stop, self._done_leading)

    async def _intake_backlog(self) -> int | None:
        """Messages on the delay lane the intake consumer has not taken yet (None: unknown)."""
        assert self.bus is not None and self.bus.js is not None
        try:
            info = await self.bus.js.consumer_info(
                self._intake_stream(), self.settings.intake_consumer
            )
        except Exception as exc:  # no consumer yet, or NATS away: the gauge keeps its value
            log.debug("intake.backlog_unknown error=%r", exc)
            return None
        return int(info.num_pending or 0)

    def stats(self) -> dict[str, Any]:
        """What `scheduler.v1.stats` answers."""
        return {
            "instance": self.settings.instance_id,
            "role": self._role(),
            "epoch": self.office.epoch if self.office else None,
            "heap": len(self.engine.horizon) if self.engine else 0,
            "version": __version__,
        }

    def _role(self) -> str:
        return "leader" if self.office is not None and self.office.may_act() else "standby"

    async def leader(self) -> dict[str, Any]:
        """What `GET /v1/leader` answers: who leads (as the lease says), and this instance's view.

        The lease value is read for display only; leadership itself is never decided by a read.
        """
        me = self.leadership.info() if self.leadership else {"instance": self.settings.instance_id}
        holder: dict[str, Any] = {}
        if self.leadership is not None:
            holder = await self.leadership.holder()
        return {
            "instance": holder.get("instance"),
            "epoch": holder.get("epoch"),
            "since": holder.get("since"),
            "self": me,
        }

    async def instances(self) -> list[dict[str, Any]]:
        """What `GET /v1/instances` answers: every instance's latest heartbeat."""
        if self.state_kv is None:
            raise ServiceUnavailableError("NATS", "the state bucket is not open yet")
        return await read_instances(self.state_kv, self.clock.now())

    # -- health -----------------------------------------------------------------------------------
    def is_alive(self) -> bool:
        """Starting or running, with a NATS connection that can still come back: nats-py
        closes one for good on some protocol errors, and then only a restart helps."""
        if self._nats_closed():
            return False
        return self.state in (RunState.STARTING, RunState.RUNNING)

    def _nats_closed(self) -> bool:
        nc = self.bus.nc if self.bus is not None else None
        return self.state is RunState.RUNNING and nc is not None and nc.is_closed

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        nats_ok = self.bus is not None and self.bus.is_connected
        ready = self.state is RunState.RUNNING and nats_ok and self.migrated
        nats = "connected" if nats_ok else "disconnected"
        body = {
            "state": self.state.value,
            "role": self._role(),
            "epoch": self.office.epoch if self.office else None,
            "instance": self.settings.instance_id,
            "nats": "closed" if self._nats_closed() else nats,
            "postgres": "migrated" if self.migrated else "pending",
            "warnings": list(self.warnings)
            + ([w] if self.clock_check and (w := self.clock_check.warning) else [])
            + (self.cron.errors if self.cron else [])
            + (list(self.engine.warnings.values()) if self.engine else []),
        }
        return ready, body


def tune_gc() -> None:
    """Fewer, cheaper collections. The loops allocate short-lived objects by the hundred
    thousand a second (messages, tasks, futures); with the default thresholds the cyclic
    collector runs hundreds of times a second and a full collection over every long-lived
    object (imported modules, the heap) stalls the loop for tens of milliseconds, which shows
    up as delivery lateness. Objects alive after start-up are frozen out of collections.
    Called by `scheduler run` once the daemon is up (it changes the whole process)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
