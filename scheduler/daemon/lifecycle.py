"""The one-process daemon: the engine and the edge on one event loop.

`scheduler run` runs the two roles as two processes (`scheduler.daemon.supervisor`): the
engine (`scheduler.daemon.engine`) takes no input from outside, the edge
(`scheduler.daemon.edge`) serves everything an outsider drives. This class runs both parts in
the caller's loop instead, each with its own NATS connection and pools as in two processes, for
the tests and benchmarks that drive a daemon in-process (and for embedding): the edge reads
the engine's state from the engine object rather than the run folder. Start order: the edge's
HTTP ports first (so `/healthz` answers while we connect; the management API is built in a
worker thread meanwhile), the engine's start (embedded servers, NATS, migrations, the pool,
provisioning, leadership), the edge's own start, then both parts' loops. A stop during the
start abandons it at once and unwinds what was started; `stopped_during_start` names the phase.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from typing import Any

from scheduler.clock import Clock, SystemClock
from scheduler.daemon import migrate
from scheduler.daemon.edge import EdgeDaemon
from scheduler.daemon.engine import EngineDaemon
from scheduler.daemon.pair import EngineReport
from scheduler.daemon.runstate import Endpoints, Phased, RunState
from scheduler.metrics import Metrics
from scheduler.operations.records import Instance
from scheduler.settings import Settings

__all__ = ["Daemon", "Endpoints", "RunState", "migrate"]

log = logging.getLogger(__name__)


class LocalEngine:
    """The edge's view of an engine in the same process (`scheduler.daemon.edge.EngineView`)."""

    paired = True

    def __init__(self, engine: EngineDaemon) -> None:
        self.engine = engine

    def report(self) -> EngineReport | None:
        return self.engine.report()

    def metrics(self) -> bytes | None:
        return None  # one registry: the edge renders the shared Metrics itself

    def others(self) -> list[tuple[str, bytes]]:
        return []


class Daemon(Phased):
    """One scheduler instance, both roles in this process (see the module doc)."""

    def __init__(
        self,
        settings: Settings,
        *,
        embedded: bool = False,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.embedded = embedded
        self.clock = clock or SystemClock()
        self.metrics = metrics or Metrics()
        self.endpoints = Endpoints()
        self.core = EngineDaemon(
            settings, embedded=embedded, clock=self.clock, metrics=self.metrics
        )
        self.edge = EdgeDaemon(
            settings,
            LocalEngine(self.core),
            embedded=embedded,
            clock=self.clock,
            metrics=self.metrics,
            own_metrics=False,
        )
        self.core.on_servers = self._servers_up

    # -- what tests and the banner read (the engine's and the edge's parts) ------------------
    @property
    def bus(self) -> Any:
        return self.core.bus

    @bus.setter
    def bus(self, value: Any) -> None:
        self.core.bus = value

    @property
    def store(self) -> Any:
        return self.core.store

    @property
    def tasks(self) -> Any:
        return self.core.tasks

    @property
    def office(self) -> Any:
        return self.core.leadership

    @property
    def leadership(self) -> Any:
        return self.core.leadership

    @property
    def engine(self) -> Any:
        return self.core.engine

    @property
    def cron(self) -> Any:
        return self.core.cron

    @property
    def state_kv(self) -> Any:
        return self.core.state_kv

    @property
    def operations(self) -> Any:
        return self.edge.operations

    @property
    def api_store(self) -> Any:
        return self.edge.api_store

    @property
    def http_app(self) -> Any:
        return self.edge.http_app

    @property
    def warnings(self) -> list[str]:
        return self.core.warnings + self.edge.warnings

    @property
    def migrated(self) -> bool:
        return self.core.migrated

    @property
    def provisioned(self) -> Any:
        return self.core.provisioned

    def stop(self) -> None:
        super().stop()
        self.core.stop()
        self.edge.stop()

    def reload(self) -> None:
        """Re-read the schedules YAML (SIGHUP)."""
        self.core.reload()

    # -- lifecycle --------------------------------------------------------------------------------
    def spawn(self, tg: asyncio.TaskGroup) -> None:
        self.core.spawn(tg)
        self.edge.spawn(tg)

    async def _ready(self) -> None:
        await self.edge.serve_api()

    def _set_state(self, state: RunState) -> None:
        self.state = self.core.state = self.edge.state = state

    async def _start(self, stack: AsyncExitStack) -> None:
        self._follow(self.edge)
        await self.edge.open_http(stack)
        self.endpoints.api, self.endpoints.metrics = (
            self.edge.endpoints.api,
            self.edge.endpoints.metrics,
        )
        self._follow(self.core)
        await self.core.start(stack)
        self.settings = self.core.settings
        self._follow(self.edge)
        await self.edge.start(stack)

    def _follow(self, part: Phased) -> None:
        """The phase shown (and named by a stop during the start) is the part's."""
        self._part = part

    @property
    def phase(self) -> str:
        part = getattr(self, "_part", None)
        return part.phase if part is not None else self._phase

    @phase.setter
    def phase(self, value: str) -> None:
        self._phase = value

    async def _servers_up(self, settings: Settings, started: list[str]) -> None:
        """The engine's embedded servers are up: the edge uses their URLs too."""
        self.edge.settings = settings
        self.endpoints.embedded += started
        self.endpoints.nats_url = settings.redacted_nats_url
        self.endpoints.database_url = settings.redacted_database_url or ""

    # -- what the daemon answers about itself ---------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return self.edge.stats()

    async def leader(self) -> dict[str, Any]:
        return await self.edge.leader()

    async def instances(self) -> list[Instance]:
        return await self.edge.instances()

    def is_alive(self) -> bool:
        return self.core.is_alive() and self.edge.is_alive()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        return self.edge.readiness()
