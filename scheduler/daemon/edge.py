"""The edge role: everything an outsider drives, in a process of its own.

The HTTP management API, the console, `/docs`, the metrics exposition and the NATS request
verbs (`scheduler.v1.*`) run here, on their own NATS connection and PostgreSQL pools; the
engine (`scheduler.daemon.engine`) takes no input from outside and never shares this loop or
this GIL (in `scheduler run`, and as separate containers in the chart). The two talk only
through PostgreSQL and NATS (the lane, the reschedule notice); what the edge shows of the
engine beside it (its state, role, warnings, metrics) it reads from the run folder the engine
writes (`scheduler.daemon.pair`), or, in the one-process daemon of the tests
(`scheduler.daemon.lifecycle`), from the engine object itself.

Start order: the HTTP ports first (so `/healthz` answers at once; the management API is built
in a worker thread meanwhile and swapped in before the edge reports itself running), then
NATS, the schema (migrated by whichever process gets there first; the other waits on the same
lock), the API's pools, the NATS service and the operations.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Protocol

from scheduler import __version__
from scheduler.api.nats_service import SchedulerService
from scheduler.api.starting import MetricsApp, StartingApp
from scheduler.bus.nats.connection import NatsBus
from scheduler.bus.nats.writer import NatsWriter
from scheduler.clock import Clock, SystemClock
from scheduler.daemon import migrate
from scheduler.daemon.crew import MAX_ENGINES, engine_folder
from scheduler.daemon.listeners import api_imported, build_api_app, listen
from scheduler.daemon.operations import build_operations
from scheduler.daemon.pair import (
    ENGINE_METRICS,
    STALE_AFTER,
    EngineReport,
    merge_expositions,
    read_engine_report,
)
from scheduler.daemon.preflight import check_api_exposure
from scheduler.daemon.runstate import Endpoints, Phased, RunState
from scheduler.daemon.upkeep import activity_upkeep, idempotency_upkeep, loop_lag_probe
from scheduler.errors import ConfigError, ServiceUnavailableError
from scheduler.leadership import heartbeat
from scheduler.leadership.partition_map import (
    UNKNOWN,
    PartitionMap,
    read_partition_map,
    unreadable,
)
from scheduler.metrics import Metrics
from scheduler.operations import paging
from scheduler.operations.bundle import Operations
from scheduler.operations.instances import read_instances
from scheduler.operations.records import Instance
from scheduler.settings import Settings
from scheduler.store.postgres.connect import PostgresStore, create_pool
from scheduler.store.postgres.intents import IntentLimits
from scheduler.store.postgres.task_admin import TaskAdmin

log = logging.getLogger(__name__)

SERVICE_POOL_SIZE = 4  # the NATS verbs' own connections (producers' cancel/reschedule/get)
METRICS_CACHE = 1.0  # seconds a rendered exposition is served to every scraper
MAP_CACHE = 0.5  # seconds a read of the partition map is served to every caller
MAP_METRICS_EVERY = 5.0  # seconds between reads of the map for its gauges


class EngineView(Protocol):
    """What the edge knows of the engine beside it: its latest report, or None when there is
    no engine beside it (an edge alone) or it has not reported yet."""

    paired: bool

    def report(self) -> EngineReport | None: ...

    def metrics(self) -> bytes | None: ...

    def others(self) -> list[tuple[str, bytes]]:
        """The metrics of engines 2..N (`scheduler run --engines N`) as (role, exposition):
        `engine-2`, ...; none beside one engine."""
        ...


class NoEngine:
    """An edge run alone (`--role edge` without SCHEDULER_RUN_DIR)."""

    paired = False

    def report(self) -> EngineReport | None:
        return None

    def metrics(self) -> bytes | None:
        return None

    def others(self) -> list[tuple[str, bytes]]:
        return []


class FolderEngine:
    """The engine beside this edge, through the run folder (`scheduler.daemon.pair`)."""

    paired = True

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def report(self) -> EngineReport | None:
        return read_engine_report(self.run_dir)

    def metrics(self) -> bytes | None:
        try:
            return (self.run_dir / ENGINE_METRICS).read_bytes()
        except OSError:
            return None

    def others(self) -> list[tuple[str, bytes]]:
        found = []
        for number in range(2, MAX_ENGINES + 1):
            try:
                data = (engine_folder(self.run_dir, number) / ENGINE_METRICS).read_bytes()
            except OSError:  # no such engine (or it has not exported yet)
                continue
            found.append((f"engine-{number}", data))
        return found


class CachedRender:
    """An exposition rendered at most once per `max_age` seconds, whatever the scrapers do."""

    def __init__(self, render: Callable[[], bytes], max_age: float = METRICS_CACHE) -> None:
        self._render, self.max_age = render, max_age
        self._at, self._data = -float("inf"), b""

    def __call__(self) -> bytes:
        now = time.monotonic()
        if now - self._at >= self.max_age:
            self._data, self._at = self._render(), now
        return self._data


class EdgeDaemon(Phased):
    """One edge: the API, console, metrics and NATS verbs of one instance."""

    part = "edge"

    def __init__(
        self,
        settings: Settings,
        engine: EngineView | None = None,
        *,
        embedded: bool = False,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        own_metrics: bool = True,
        announce: Callable[[EdgeDaemon], None] | None = None,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.engine_view: EngineView = engine or NoEngine()
        self.embedded = embedded
        self.clock = clock or SystemClock()
        self.metrics = metrics or Metrics()
        self.endpoints = Endpoints()
        self.bus: NatsBus | None = None
        self.api_store: PostgresStore | None = None
        self.service_store: PostgresStore | None = None
        self.operations: Operations | None = None
        self.state_kv: Any = None
        self.leader_kv: Any = None
        self.warnings: list[str] = []
        self.migrated = False
        self.http_app = StartingApp(self)
        self._api_build: asyncio.Future[Any] | None = None
        self._map: PartitionMap | None = None
        self._map_at = 0.0
        self._map_lock = asyncio.Lock()
        self._announce = announce or (lambda edge: None)  # where it listens, once and running
        self._render = CachedRender(self._exposition if own_metrics else self.metrics.render)
        if own_metrics:
            self.metrics.daemon_started(__version__, settings.instance_id)

    # -- alone (`scheduler run --role edge`, and `scheduler run`'s child) ----------------------
    async def _start(self, stack: AsyncExitStack) -> None:
        await self.open_http(stack)
        await self.start(stack)

    async def _ready(self) -> None:
        await self.serve_api()

    def _set_state(self, state: RunState) -> None:
        self.state = state
        if state is RunState.RUNNING:
            self._announce(self)

    # -- parts -------------------------------------------------------------------------------
    async def open_http(self, stack: AsyncExitStack) -> None:
        from scheduler.api.edge import host_policy  # the framework, in the edge only

        s = self.settings
        self._enter("opening the HTTP ports")
        self._api_build = self._build_api()
        stack.push_async_callback(self._drop_api_build)
        api = await listen(self.http_app, s, s.http_port, "SCHEDULER_HTTP_PORT", self.embedded)
        stack.push_async_callback(api.close)
        scrape = MetricsApp(self._render, host_policy(s))
        metrics = await listen(scrape, s, s.metrics_port, "SCHEDULER_METRICS_PORT", self.embedded)
        stack.push_async_callback(metrics.close)
        self.endpoints.api, self.endpoints.metrics = api, metrics
        self._warn(check_api_exposure(s))
        self._announce(self)

    async def start(self, stack: AsyncExitStack) -> None:
        """NATS, the schema, the pools, the NATS service and the operations."""
        s = self.settings
        if s.nats_url is None:
            raise ConfigError("SCHEDULER_NATS_URL", "not set (the edge connects to the engine's)")
        if s.database_url is None:
            raise ConfigError("SCHEDULER_DATABASE_URL", "not set (the edge reads the engine's)")
        budget = s.startup_timeout.total_seconds()
        self._enter("connecting to NATS")
        self.bus = NatsBus(s, self.metrics, "edge")
        stack.push_async_callback(self.bus.close)
        await self.bus.connect(budget)
        nc = self.bus.nc
        assert nc is not None and self.bus.js is not None
        dsn = s.database_dsn
        assert dsn is not None
        await migrate.at_start(dsn, budget, self._enter)
        self.migrated = True
        self._enter("opening the PostgreSQL pools")
        self.api_store = await self._open_api_pool(stack, budget)
        self.service_store = await self._open_pool(stack, budget, SERVICE_POOL_SIZE)
        self._enter("opening the buckets")
        await self._open_buckets(budget)
        self._enter("starting the service")
        limits = IntentLimits.from_settings(s)
        writer = NatsWriter(nc)
        own = build_operations(
            writer,
            s,
            self.service_store,
            TaskAdmin(self.service_store, limits),
            self.clock,
            self.leader,
        )
        self.operations = build_operations(
            writer, s, self.api_store, TaskAdmin(self.api_store, limits), self.clock, self.leader
        )
        stack.callback(setattr, self, "operations", None)  # API: 503 before the pool closes
        service = SchedulerService(nc, s, own.tasks, self.clock, self.stats, self.leader)
        await service.start()
        stack.push_async_callback(service.stop)

    def spawn(self, tg: asyncio.TaskGroup) -> None:
        """The edge's loops, owned by `tg`; they end when `stop()` is called."""
        ops, s, stop = self.operations, self.settings, self._stop
        assert ops is not None
        tg.create_task(ops.backlog.run(stop), name="write-backlog")
        pruned = activity_upkeep(ops.activity, s, self.metrics, stop)
        tg.create_task(pruned, name="activity-upkeep")
        expired = idempotency_upkeep(lambda: ops.idempotency.prune(self.clock.now()), stop)
        tg.create_task(expired, name="idempotency-upkeep")
        tg.create_task(loop_lag_probe(self.metrics, stop), name="edge-loop-lag")
        tg.create_task(self._map_upkeep(stop), name="partition-map")

    async def _map_upkeep(self, stop: asyncio.Event) -> None:
        """Read the partition map every MAP_METRICS_EVERY s, so its gauges stay current while
        nobody asks `/v1/leader`."""
        while not stop.is_set():
            await self.partition_map()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), MAP_METRICS_EVERY)

    async def serve_api(self) -> None:
        """Swap the management API in once its thread has built it."""
        assert self._api_build is not None
        self.http_app.app = await self._api_build

    # -- start-up steps ------------------------------------------------------------------------
    def _build_api(self) -> asyncio.Future[Any]:
        """Build the management API in a daemon thread: a stop during the start must not wait
        for its imports, and asyncio.run would wait for a thread of the default executor.
        Once the process has imported it (another daemon in the same process, as in the
        tests), the build takes ~25 ms and is done here."""
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

    async def _drop_api_build(self) -> None:
        if self._api_build is not None:
            self._api_build.cancel()
            await asyncio.gather(self._api_build, return_exceptions=True)

    async def _open_api_pool(self, stack: AsyncExitStack, budget: float) -> PostgresStore:
        """The management API's pool: SCHEDULER_API_POOL_SIZE connections whose statements
        PostgreSQL cuts at SCHEDULER_API_STATEMENT_TIMEOUT."""
        s = self.settings
        timeout = s.api_statement_timeout.total_seconds()
        return await self._open_pool(stack, budget, s.api_pool_size, timeout, custom_plans=True)

    async def _open_pool(
        self,
        stack: AsyncExitStack,
        budget: float,
        size: int,
        timeout: float | None = None,
        custom_plans: bool = False,
    ) -> PostgresStore:
        dsn = self.settings.database_dsn
        assert dsn is not None
        pool = await create_pool(
            dsn,
            budget,
            min_size=1,
            max_size=size,
            statement_timeout=timeout,
            custom_plans=custom_plans,
        )
        store = PostgresStore(pool, self.metrics, acquire_timeout=timeout)
        stack.push_async_callback(store.close)
        return store

    async def _open_buckets(self, budget: float) -> None:
        """The lease and state buckets (read only here); an edge that starts before any
        engine provisioned them waits for them within the start-up budget."""
        assert self.bus is not None and self.bus.js is not None
        js, s = self.bus.js, self.settings
        deadline = time.monotonic() + budget
        while True:
            try:
                self.leader_kv = await js.key_value(s.leader_bucket)
                self.state_kv = await js.key_value(s.state_bucket)
                break
            except Exception as exc:  # not provisioned yet: the engine creates them
                if time.monotonic() >= deadline:
                    raise ServiceUnavailableError(
                        "NATS", f"the buckets {s.leader_bucket}/{s.state_bucket}: {exc!r}"
                    ) from exc
                await asyncio.sleep(0.2)
        await paging.load_key(self.state_kv)  # cursors signed alike by every instance

    def _warn(self, warning: str | None) -> None:
        if warning is not None:
            self.warnings.append(warning)

    # -- metrics ---------------------------------------------------------------------------------
    def _exposition(self) -> bytes:
        """This edge's metrics and, beside them, the engine's latest export."""
        parts = [("edge", self.metrics.render())]
        engine = self.engine_view.metrics()
        if engine is not None:
            parts.insert(0, ("engine", engine))
        parts[1:1] = self.engine_view.others()
        return merge_expositions(parts)

    # -- what the edge answers -------------------------------------------------------------------
    def engine_report(self) -> EngineReport | None:
        """The engine's report while it is fresh; a stale one (the engine stopped answering)
        counts as none."""
        report = self.engine_view.report()
        if report is None or (self.engine_view.paired and report.age() > STALE_AFTER):
            return None
        return report

    def stats(self) -> dict[str, Any]:
        """What `scheduler.v1.stats` answers."""
        report = self.engine_report()
        return {
            "instance": self.settings.instance_id,
            "role": report.role if report else self._alone_role(),
            "epoch": report.epoch if report else None,
            "heap": report.heap if report else 0,
            "version": __version__,
        }

    def _alone_role(self) -> str:
        return "unknown" if self.engine_view.paired else "edge"

    async def leader(self) -> dict[str, Any]:
        """What `GET /v1/leader` (and `scheduler.v1.leader`) answers: who leads under P = 1 (as
        the lease says, read for display only), the partition map (every partition's owner,
        epoch and since, each engine's share, the partitions nobody holds), and this
        instance's engine's view. Under P > 1 nobody leads alone: `instance`, `epoch` and
        `since` are null and the map tells who holds what."""
        report = self.engine_report()
        me = report.leader if report else {"instance": self.settings.instance_id}
        held = await self.partition_map()
        single = held.leases[0] if held.count == 1 else None
        owner = single.owner if single is not None and single.owner != UNKNOWN else None
        return {
            "instance": owner,
            "epoch": single.epoch if owner is not None and single is not None else None,
            "since": single.since if owner is not None and single is not None else None,
            "self": me,
            **held.to_json(),
        }

    async def partition_map(self) -> PartitionMap:
        """The lease bucket's partition map, read at most once per MAP_CACHE seconds whatever
        the number of callers (`/v1/leader` needs no token)."""
        async with self._map_lock:
            now = time.monotonic()
            if self._map is None or now - self._map_at >= MAP_CACHE:
                count = self.settings.partitions
                if self.leader_kv is None:
                    self._map = unreadable(count)
                else:
                    self._map = await read_partition_map(self.leader_kv, count)
                self._map_at = now
                if self._map.readable:
                    self.metrics.partition_map_read(self._map.engines(), len(self._map.unowned()))
            return self._map

    async def instances(self) -> list[Instance]:
        """What `GET /v1/instances` answers: every instance's latest heartbeat."""
        if self.state_kv is None:
            raise ServiceUnavailableError("NATS", "the state bucket is not open yet")
        return await read_instances(self.state_kv, self.clock.now(), heartbeat.STALE_AFTER)

    def is_alive(self) -> bool:
        """Starting or running with a NATS connection that can still come back; with an
        engine beside it, that engine's too (nats-py gives some connections up for good, and
        then only a restart helps)."""
        nc = self.bus.nc if self.bus is not None else None
        if self.state is RunState.RUNNING and nc is not None and nc.is_closed:
            return False
        report = self.engine_report()
        if report is not None and report.nats == "closed":
            return False
        return self.state in (RunState.STARTING, RunState.RUNNING)

    def edge_body(self) -> dict[str, Any]:
        nats_ok = self.bus is not None and self.bus.is_connected
        closed = self.bus is not None and self.bus.nc is not None and self.bus.nc.is_closed
        ready = self.state is RunState.RUNNING and nats_ok and self.migrated
        return {
            "ready": ready,
            "state": self.state.value,
            "nats": "closed" if closed else ("connected" if nats_ok else "disconnected"),
            "postgres": "migrated" if self.migrated else "pending",
            "warnings": list(self.warnings),
        }

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """`/readyz`: ready when this edge is, and (with an engine beside it) that engine too.
        The top-level fields are the engine's (role, epoch) as before the split; `roles`
        tells each role's own readiness."""
        edge = self.edge_body()
        report = self.engine_report()
        engine = None
        if report is not None:
            engine = {
                "ready": report.ready,
                "state": report.state,
                "role": report.role,
                "epoch": report.epoch,
                "nats": report.nats,
                "postgres": report.postgres,
                "pid": report.pid,
            }
        elif self.engine_view.paired:
            engine = {"ready": False, "state": "unknown", "role": "unknown"}
        ready = edge["ready"] and (engine is None or bool(engine["ready"]))
        if not self.engine_view.paired:
            ready = edge["ready"]
        state = edge["state"] if engine is None or engine["state"] == "running" else engine["state"]
        body = {
            "state": state,
            "role": engine["role"] if engine else "edge",
            "epoch": engine.get("epoch") if engine else None,
            "instance": self.settings.instance_id,
            "nats": edge["nats"] if engine is None else _worst(edge["nats"], engine.get("nats")),
            "postgres": _pg(edge["postgres"], engine.get("postgres") if engine else None),
            "warnings": (list(report.warnings) if report else []) + edge["warnings"],
            "roles": {"engine": engine, "edge": edge},
        }
        return ready, body


def _worst(a: str, b: Any) -> str:
    order = ["closed", "disconnected", "connected"]
    return min((a, str(b or "disconnected")), key=lambda v: order.index(v) if v in order else 0)


def _pg(a: str, b: Any) -> str:
    return "migrated" if a == "migrated" and b in (None, "migrated") else "pending"
