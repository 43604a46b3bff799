"""The engine role: leadership, intake, the horizon, claims, firing, cron and the fence.

It takes input only from the delay lane, NATS KV and PostgreSQL: it serves no HTTP, answers
no NATS request and parses no byte an operator sends (the edge does, `scheduler.daemon.edge`).
What the edge beside it shows of it (state, role, metrics) it writes to the run folder
(`scheduler.daemon.pair`) and never reads back.

Start order: the embedded servers if asked (`embedded.start_missing`; `on_servers` is told the
settings with their URLs, so `scheduler run` can start its edge, and `before_servers_stop`, run
before the servers stop, waits for that edge to end), NATS, migrations, the
PostgreSQL pool, provisioning (with the checks of `preflight`), then the loops: leadership and
its heartbeat, the role loop (`terms.TermLoop`), housekeeping (`upkeep`), the leader's gauges
(`Refresher`), the clock check and the status export. Every component registers its own
cleanup on one AsyncExitStack; `stop()` only signals, and shutdown is bounded by
`SCHEDULER_SHUTDOWN_GRACE`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from nats.js.errors import BucketNotFoundError, NotFoundError

from scheduler import __version__
from scheduler.aio import first_of
from scheduler.bus.nats.connection import (
    NatsBus,
    ProvisionNote,
    lane_window_warning,
    provision,
    while_electing,
)
from scheduler.clock import Clock, SystemClock
from scheduler.daemon import migrate
from scheduler.daemon.embedded import start_missing
from scheduler.daemon.pair import (
    ENGINE_METRICS,
    ENGINE_STATUS,
    STATUS_EVERY,
    EngineReport,
    write_atomic,
    write_json,
)
from scheduler.daemon.preflight import check_lease_bucket, check_replicas, check_server_version
from scheduler.daemon.refresher import Refresher
from scheduler.daemon.runstate import Phased, RunState
from scheduler.daemon.upkeep import dead_letter_upkeep, fire_log_upkeep, loop_lag_probe
from scheduler.engine.cron.firing import CronEngine
from scheduler.engine.leader_loop import LeaderEngine
from scheduler.leadership.election import Leadership
from scheduler.leadership.partitioned import PartitionedLeadership
from scheduler.leadership.skew import ClockCheck
from scheduler.leadership.terms import TermLoop
from scheduler.metrics import Metrics
from scheduler.operations import paging
from scheduler.settings import Settings
from scheduler.store.postgres.connect import PostgresStore, create_pool
from scheduler.store.postgres.cron_jobs import ScheduleStore
from scheduler.store.postgres.dead_letters import DeadLetterStore
from scheduler.store.postgres.epoch import database_time
from scheduler.store.postgres.intents import IntentLimits
from scheduler.store.postgres.overview import OverviewStore
from scheduler.store.postgres.partitioning import check_partitions
from scheduler.store.postgres.tasks import TaskStore

log = logging.getLogger(__name__)

RENDER_SWITCH = 0.0005  # seconds between GIL hand-overs while the metrics render runs
BUCKET_SETTLE = 15.0  # s a bucket just provisioned may take to be found on a cluster


class EngineDaemon(Phased):
    """One engine: stands for office, fires while it holds it."""

    part = "engine"

    def __init__(
        self,
        settings: Settings,
        *,
        embedded: bool = False,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        run_dir: Path | None = None,
        on_servers: Callable[[Settings, list[str]], Awaitable[None]] | None = None,
        before_servers_stop: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.embedded = embedded
        self.clock = clock or SystemClock()
        self.metrics = metrics or Metrics()
        self.run_dir = run_dir
        self.on_servers = on_servers
        self.before_servers_stop = before_servers_stop
        self.embedded_started: list[str] = []
        self.bus: NatsBus | None = None
        self.store: PostgresStore | None = None
        self.tasks: TaskStore | None = None
        self.leadership: Leadership | PartitionedLeadership | None = None
        self.schedules: ScheduleStore | None = None
        self.clock_check: ClockCheck | None = None
        self.state_kv: Any = None
        self.leader_kv: Any = None
        self.engine: LeaderEngine | None = None
        self.cron: CronEngine | None = None
        self.refresher: Refresher | None = None
        self.provisioned: list[ProvisionNote] = []
        self.warnings: list[str] = []
        self.migrated = False
        self.done_leading = asyncio.Event()  # set once the engine ended and the lease is given up
        self._term_partitions: frozenset[int] = frozenset()  # the previous term's (metrics)
        self.metrics.daemon_started(__version__, settings.instance_id)

    def reload(self) -> None:
        """Re-read the schedules YAML (SIGHUP)."""
        if self.cron is not None:
            self.cron.request_reload()

    def _set_state(self, state: RunState) -> None:
        self.state = state
        if state is RunState.STOPPED:
            self._export_status()  # the edge beside it sees the engine stopped at once

    # -- parts, for `run` and for the one-process daemon (`scheduler.daemon.lifecycle`) ------
    async def start(self, stack: AsyncExitStack) -> None:
        await self._start(stack)

    async def _start(self, stack: AsyncExitStack) -> None:
        s = self.settings = await self._start_embedded(stack)
        if self.before_servers_stop is not None:
            # pushed after the embedded servers' stops, so it runs before them: what uses the
            # servers beside this process (the edge of `scheduler run`) ends while they still run
            stack.push_async_callback(self.before_servers_stop)
        if self.on_servers is not None:
            await self.on_servers(s, self.embedded_started)
        budget = s.startup_timeout.total_seconds()
        self._enter("connecting to NATS")
        self.bus = NatsBus(s, self.metrics, "engine")
        stack.push_async_callback(self.bus.close)
        await self.bus.connect(budget)
        self.check_server_version()
        self.store = await self._open_postgres(stack, budget)
        self._enter("provisioning streams and buckets")
        self.leader_kv = await self.bus.setup(while_electing(self._provision, "provision"))
        self._enter("starting the lease")
        self.tasks = TaskStore(self.store, IntentLimits.from_settings(s), s.partitions)
        self.clock_check = ClockCheck(
            functools.partial(database_time, self.store.pool),
            self.clock,
            s.max_clock_skew.total_seconds(),
            self.metrics,
        )
        await self.clock_check.measure()
        self.schedules = ScheduleStore(self.store, s.partitions)
        self.leadership = self._leadership()
        self.bus.link_listeners.append(self.leadership.on_link)
        self.metrics.standing_by()
        self._build_engine()

    def _leadership(self) -> Leadership | PartitionedLeadership:
        """One lease for one term over every partition under P = 1; a lease per partition and
        terms over a fair share of them under P > 1 (`leadership.partitioned`)."""
        s = self.settings
        assert self.store is not None and self.clock_check is not None
        if s.partitions == 1:
            return Leadership(
                self.leader_kv,
                self.store.pool,
                s,
                self.clock,
                self.metrics,
                clock_ok=self.clock_check.ok,
                clock_check=self.clock_check.measure,
            )
        return PartitionedLeadership(
            self.leader_kv,
            self.store.pool,
            s,
            self.clock,
            self.metrics,
            state_kv=self.state_kv,
            clock_ok=self.clock_check.ok,
            on_term=self._own,
        )

    def _own(self, partitions: Sequence[int]) -> None:
        """A term over `partitions` begins: the stores' reads and fences are theirs."""
        assert self.tasks is not None and self.schedules is not None
        self.tasks.office = self.schedules.office = tuple(partitions)
        gained = set(partitions) - self._term_partitions
        self._term_partitions = frozenset(partitions)
        self.metrics.term_partitions(len(partitions), len(gained))

    def _build_engine(self) -> None:
        s = self.settings
        assert self.store is not None and self.bus is not None and self.leadership is not None
        assert self.tasks is not None and self.schedules is not None
        schedules = self.schedules
        self.cron = CronEngine(s, schedules, self.leadership, self.clock, self.metrics, self.bus)
        self.engine = LeaderEngine(
            s,
            self.bus,
            self.tasks,
            self.leadership,
            self.clock,
            self.metrics,
            self.intake_stream(),
            self.cron,
        )
        self.refresher = Refresher(
            s,
            OverviewStore(self.store),
            DeadLetterStore(self.store),
            schedules,
            self.metrics,
            self.clock,
            self.leadership.may_act,
            self._intake_backlog,
            self.cron,
        )

    def spawn(self, tg: asyncio.TaskGroup) -> None:
        """The engine's loops, owned by `tg`; they end when `stop()` is called."""
        assert self.leadership is not None and self.store is not None
        assert self.refresher is not None and self.bus is not None and self.bus.nc is not None
        assert self.clock_check is not None
        s, stop = self.settings, self._stop
        tg.create_task(self.leadership.run(self.done_leading), name="leadership")
        tg.create_task(
            self.leadership.heartbeat(self.state_kv, self.done_leading), name="heartbeat"
        )
        tg.create_task(fire_log_upkeep(self.store, self.tasks, s, stop), name="fire-log-upkeep")
        dead = DeadLetterStore(self.store)
        pruning = dead_letter_upkeep(dead, s, self.clock, self.metrics, stop)
        tg.create_task(pruning, name="dead-letter-upkeep")
        tg.create_task(self._term_loop().run(), name="engine")
        tg.create_task(loop_lag_probe(self.metrics, stop), name="loop-lag")
        tg.create_task(self.refresher.run(self.bus.nc, stop), name="refresher")
        tg.create_task(self.clock_check.run(self.done_leading), name="clock-check")
        if self.run_dir is not None:
            tg.create_task(self._export(stop), name="status-export")

    # -- the run folder --------------------------------------------------------------------------
    async def _export(self, stop: asyncio.Event) -> None:
        """`engine.json` every STATUS_EVERY s and at once on a change of role; `engine.prom`
        every SCHEDULER_METRICS_EXPORT_INTERVAL (`scheduler.daemon.pair`)."""
        every = self.settings.metrics_export_interval.total_seconds()
        rendered = 0.0
        while not stop.is_set():
            self._export_status()
            if time.monotonic() - rendered >= every:
                await asyncio.to_thread(self._export_metrics)
                rendered = time.monotonic()
            await first_of(asyncio.sleep(STATUS_EVERY), stop.wait(), self._role_change())

    def _role_change(self) -> Awaitable[object]:
        """Set when this engine's role changes (the status is rewritten at once)."""
        if self.leadership is None:
            return asyncio.Event().wait()
        tenure = self.leadership.tenure
        return tenure.lost.wait() if self.role() == "leader" else tenure.gained.wait()

    def _export_status(self) -> None:
        if self.run_dir is None:
            return
        try:
            write_json(self.run_dir / ENGINE_STATUS, self.report().to_json())
        except OSError as exc:  # the folder went away: the edge shows the engine as stale
            log.warning("engine.status_export_failed error=%r", exc)

    def _export_metrics(self) -> None:
        """In a worker thread: rendering a full registry is pure Python (5-25 ms at ~1,000
        samples on a 2-core host), which on the loop would hold every due task for that long.
        With the GIL handed over every RENDER_SWITCH s instead of every 5 ms meanwhile, the
        loop waits at most about that long for it at each wake-up while a render runs."""
        assert self.run_dir is not None
        previous = sys.getswitchinterval()
        sys.setswitchinterval(RENDER_SWITCH)
        try:
            data = self.metrics.render()
        finally:
            sys.setswitchinterval(previous)
        try:
            write_atomic(self.run_dir / ENGINE_METRICS, data)
        except OSError as exc:
            log.warning("engine.metrics_export_failed error=%r", exc)

    # -- what the engine says about itself ------------------------------------------------------
    def role(self) -> str:
        held = self.leadership is not None and self.leadership.may_act()
        return "leader" if held else "standby"

    def ready(self) -> bool:
        nats_ok = self.bus is not None and self.bus.is_connected
        return self.state is RunState.RUNNING and nats_ok and self.migrated

    def nats_state(self) -> str:
        if self.nats_closed():
            return "closed"
        return "connected" if self.bus is not None and self.bus.is_connected else "disconnected"

    def nats_closed(self) -> bool:
        nc = self.bus.nc if self.bus is not None else None
        return self.state is RunState.RUNNING and nc is not None and nc.is_closed

    def all_warnings(self) -> list[str]:
        check = self.clock_check.warning if self.clock_check else None
        return (
            list(self.warnings)
            + ([check] if check else [])
            + (self.cron.errors if self.cron else [])
            + (list(self.engine.warnings.values()) if self.engine else [])
        )

    def report(self) -> EngineReport:
        me = self.leadership.info() if self.leadership else {"instance": self.settings.instance_id}
        return EngineReport(
            instance=self.settings.instance_id,
            state=self.state.value,
            role=self.role(),
            epoch=self.leadership.epoch if self.leadership else None,
            nats=self.nats_state(),
            postgres="migrated" if self.migrated else "pending",
            ready=self.ready(),
            heap=len(self.engine.horizon) if self.engine else 0,
            warnings=self.all_warnings(),
            leader=me,
            pid=os.getpid(),
            at=time.time(),
        )

    def is_alive(self) -> bool:
        """Starting or running, with a NATS connection that can still come back: nats-py
        closes one for good on some protocol errors, and then only a restart helps."""
        if self.nats_closed():
            return False
        return self.state in (RunState.STARTING, RunState.RUNNING)

    # -- start-up steps --------------------------------------------------------------------------
    async def _start_embedded(self, stack: AsyncExitStack) -> Settings:
        """Start whichever server has no URL (embedded mode), or fail naming the variable."""
        s, started = await start_missing(self.settings, self.embedded, stack, self._enter)
        self.embedded_started += started
        return s

    def check_server_version(self) -> None:
        assert self.bus is not None
        self._warn(check_server_version(self.bus, self.settings))

    def _warn(self, warning: str | None) -> None:
        """Keep a start-up check's warning for `/readyz`."""
        if warning is not None:
            self.warnings.append(warning)

    async def _open_postgres(self, stack: AsyncExitStack, budget: float) -> PostgresStore:
        """First contact (retried for `budget` s), migrations, then the pool, and the
        partition count checked against the one the database records."""
        dsn = self.settings.database_dsn
        assert dsn is not None
        await migrate.at_start(dsn, budget, self._enter)
        self.migrated = True
        self._enter("opening the PostgreSQL pool")
        store = PostgresStore(await create_pool(dsn, budget), self.metrics)
        stack.push_async_callback(store.close)
        await check_partitions(store.pool, self.settings.partitions)
        self.metrics.postgres_connected()
        return store

    async def _provision(self) -> Any:
        """Provision (when asked), check the lease bucket, open both buckets; the lease KV."""
        assert self.bus is not None and self.bus.js is not None
        if self.settings.provision:
            self.provisioned = await provision(self.bus, embedded=self.embedded)
        await self._check_lane_window()
        self._warn(await check_lease_bucket(self.bus, self.settings))
        self._warn(await check_replicas(self.bus, self.settings, self.embedded))
        leader_kv = await self._bucket(self.settings.leader_bucket)
        self.state_kv = await self._bucket(self.settings.state_bucket)
        await paging.load_key(self.state_kv)  # cursors signed alike by every instance
        return leader_kv

    async def _bucket(self, name: str) -> Any:
        """The KV bucket `name`. Just provisioned (by this instance or one starting beside it),
        a replicated bucket's stream may answer "not found" for a moment on a cluster while its
        group forms (seen on a 3-node cluster under load): then it is asked again, for up to
        BUCKET_SETTLE s. Without provisioning a missing bucket is an error at once."""
        assert self.bus is not None and self.bus.js is not None
        deadline = time.monotonic() + (BUCKET_SETTLE if self.settings.provision else 0.0)
        while True:
            try:
                return await self.bus.js.key_value(name)
            except BucketNotFoundError:
                if time.monotonic() >= deadline:
                    raise
                log.warning("nats.bucket_not_yet bucket=%s", name)
                await asyncio.sleep(0.2)

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
            warning = await lane_window_warning(self.bus, self.intake_stream())
        except NotFoundError:
            warning = f"the delay lane's stream {self.intake_stream()} does not exist yet"
        if warning is not None:
            log.warning("nats.lane_duplicate_window %s", warning)
        self._warn(warning)

    def intake_stream(self) -> str:
        """The configured intake stream, or the stream found covering the delay lane."""
        for note in self.provisioned:
            if note.kind == "stream" and note.name == self.settings.intake_stream:
                return note.detail if note.status == "covered" else note.name
        return self.settings.intake_stream

    def _term_loop(self) -> TermLoop:
        assert self.engine is not None and self.leadership is not None
        grace = self.settings.shutdown_grace.total_seconds()
        return TermLoop(self.engine, self.leadership, grace, self._stop, self.done_leading)

    async def _intake_backlog(self) -> int | None:
        """Messages on the delay lane the intake consumer has not taken yet (None: unknown)."""
        assert self.bus is not None and self.bus.js is not None
        try:
            info = await self.bus.js.consumer_info(
                self.intake_stream(), self.settings.intake_consumer
            )
        except Exception as exc:  # no consumer yet, or NATS away: the gauge keeps its value
            log.debug("intake.backlog_unknown error=%r", exc)
            return None
        return int(info.num_pending or 0)
