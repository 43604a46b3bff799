"""The management API in-process on the operator half's twins: no server, no daemon.

`edge_on_twins()` builds `scheduler.api.app.build_api` over a backend whose `operations` are
made from the in-memory twins (`scheduler.store.memory*`), a `MemoryWriter` over
`MemoryStreams` holding the delay lane and the target streams TASKS and SCHEDULED, and the cron
jobs of tests/integration/api/harness.py's JOBS written to `jobs.yaml` and synced as the engine
syncs them; requests go through httpx's `ASGITransport`, as
the console's do (`scheduler/console/client.py`). `EdgeOnTwins.call` answers as
`ApiHarness.call` does, so a test moved here keeps its assertions.

A port with no twin yet (task reads, the fire history, PostgreSQL's clock) is
`Missing`: a test that reaches it fails naming the port, and belongs on real servers
(tests/integration/api) until that twin exists.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import httpx

from scheduler.api.app import build_api
from scheduler.bus.memory import MemoryStreams, MemoryWriter, Stored
from scheduler.clock import Clock, SystemClock
from scheduler.cron.jobs import load_dir
from scheduler.metrics import Metrics
from scheduler.operations.activity import ActivityOperations
from scheduler.operations.backlog import WriteBacklog
from scheduler.operations.bundle import Operations
from scheduler.operations.cron_jobs import ScheduleOperations
from scheduler.operations.dead_letters import DeadLetterOperations
from scheduler.operations.records import Instance
from scheduler.operations.stats import StatsOperations
from scheduler.operations.stores import (
    DatabaseTime,
    FireHistory,
    TaskReads,
)
from scheduler.operations.tasks import TaskOperations
from scheduler.settings import Settings
from scheduler.store.memory import MemoryTaskStore
from scheduler.store.memory_activity import MemoryActivityStore
from scheduler.store.memory_dead_letters import MemoryDeadLetterStore
from scheduler.store.memory_idempotency import MemoryIdempotencyStore
from scheduler.store.memory_schedules import MemoryBackfills, MemorySchedules
from scheduler.store.memory_statistics import MemoryStatistics
from tests.integration.api.harness import ADMIN, JOBS, READ, Reply, request_headers, write_jobs

__all__ = ["ADMIN", "READ", "EdgeOnTwins", "Reply", "edge_on_twins"]


class Missing:
    """Stands for a port that has no twin yet: any use fails, naming it."""

    def __init__(self, port: str) -> None:
        self.port = port

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(
            f"{self.port}.{name}: no twin of {self.port} yet; this test runs on real servers"
        )

    async def __call__(self) -> Any:
        raise AssertionError(f"{self.port}: no twin yet; this test runs on real servers")


class TwinBackend:
    """`scheduler.api.app.ApiBackend` over the twins' operations."""

    def __init__(self, settings: Settings, operations: Operations) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self._operations = operations

    @property
    def operations(self) -> Operations | None:
        return self._operations

    def is_alive(self) -> bool:
        return True

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        return True, {"status": "ready", "instance": self.settings.instance_id}

    async def leader(self) -> dict[str, Any]:
        return {}

    async def instances(self) -> list[Instance]:
        return []


class EdgeOnTwins:
    """The API's app on twins, an httpx client calling it, and the twins themselves."""

    def __init__(self, settings: Settings, clock: Clock) -> None:
        self.settings, self.clock = settings, clock
        self.streams = MemoryStreams()
        self.streams.add_stream(settings.intake_stream, [settings.intake_subject])
        self.streams.add_stream("TASKS", ["mq.tasks.>"])
        self.streams.add_stream("SCHEDULED", ["mq.scheduled.>"])
        self.writer = MemoryWriter(self.streams)
        self.tasks = MemoryTaskStore(now=clock.now)
        self.schedules = MemorySchedules(clock.now)
        self.backfills = MemoryBackfills(self.schedules)
        self.idempotency = MemoryIdempotencyStore(settings.idempotency_max_keys)
        self.activity = MemoryActivityStore()
        self.dead_letters = MemoryDeadLetterStore(self.tasks, clock.now)
        self.backend = TwinBackend(settings, self._operations())
        self.metrics = self.backend.metrics
        self.app = build_api(self.backend)

    def _operations(self) -> Operations:
        s, clock, backlog, bus = self.settings, self.clock, WriteBacklog(), self.writer
        task_ops = TaskOperations(bus, s, self.tasks, cast(TaskReads, Missing("TaskReads")), clock)
        dead = self.dead_letters
        backfills = self.backfills
        stats = StatsOperations(
            MemoryStatistics(self.tasks, [self.schedules.fire_log]),
            dead,
            cast(FireHistory, Missing("FireHistory")),
            cast(DatabaseTime, Missing("DatabaseTime")),
            clock,
            _no_lease,
        )
        return Operations(
            tasks=task_ops,
            schedules=ScheduleOperations(
                bus, s, self.schedules, self.schedules, backfills, clock, backlog
            ),
            dead_letters=DeadLetterOperations(bus, s, dead, task_ops, clock),
            stats=stats,
            idempotency=self.idempotency,
            backlog=backlog,
            clock=clock,
            activity=ActivityOperations(self.activity, clock, s.activity_max_rows),
        )

    async def call(
        self,
        method: str,
        path: str,
        token: str | None = ADMIN,
        json_body: Any = None,
        data: bytes | None = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """As `ApiHarness.call`: header values go as latin-1 bytes, as aiohttp sends them."""
        sent = request_headers(token, headers, data is not None)
        raw_headers = {k.encode(): v.encode("latin-1") for k, v in sent.items()}
        query = {k: str(v) for k, v in (params or {}).items()}
        transport = httpx.ASGITransport(app=self.app, client=("127.0.0.1", 50000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            resp = await http.request(
                method, path, headers=raw_headers, json=json_body, content=data, params=query
            )
        try:
            body = json.loads(resp.content) if resp.content else None
        except ValueError:
            body = None
        return Reply(resp.status_code, resp.headers, body)  # by name in any case, as aiohttp's

    async def read_stream(
        self, stream: str, quiet: float = 1.0, within: float = 10.0, subject: str = ">"
    ) -> list[Stored]:
        """Every message of `stream` on `subject` (`>`: all): nothing is in flight in-process,
        so there is no quiet time to wait for."""
        held = self.streams.messages(stream)
        return [m for m in held if subject == ">" or m.subject == subject]


@asynccontextmanager
async def edge_on_twins(
    tmp_path: Path, clock: Clock | None = None, jobs: str = JOBS, **overrides: Any
) -> AsyncIterator[EdgeOnTwins]:
    """The API on twins with both tokens, fast retries and the `jobs` YAML synced."""
    settings = Settings(
        schedules_dir=tmp_path / "schedules",
        data_dir=tmp_path / "data",
        instance_id="test-1",
        admin_token=ADMIN,
        read_token=READ,
        backoff=timedelta(milliseconds=100),
        forecast_interval=timedelta(milliseconds=200),
    ).with_overrides(**overrides)
    settings.schedules_dir.mkdir(exist_ok=True)
    write_jobs(settings, jobs)
    edge = EdgeOnTwins(settings, clock or SystemClock())
    await edge.schedules.sync(load_dir(settings.schedules_dir).jobs, edge.clock.now())
    yield edge


async def _no_lease() -> dict[str, Any]:
    """The KV lease as `/v1/stats` reads it: nobody holds it (no engine runs here)."""
    return {}
