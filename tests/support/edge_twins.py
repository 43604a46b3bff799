"""The management API in-process on the operator half's twins: no server, no daemon.

`edge_on_twins()` builds `scheduler.api.app.build_api` over a backend whose `operations` are
made from the in-memory twins (`scheduler.store.memory*`), a `MemoryWriter` over
`MemoryStreams` holding the delay lane and the target streams TASKS and SCHEDULED, and the cron
jobs of tests/integration/api/harness.py's JOBS written to `jobs.yaml` and synced as the engine
syncs them; requests go through httpx's `ASGITransport`, as
the console's do (`scheduler/console/client.py`). `EdgeOnTwins.call` answers as
`ApiHarness.call` does, so a test moved here keeps its assertions.

Every port of the operator half has its twin here: the task reads and the fire history read
the engine's twin (`tasks`), whose rows, tombstones and fire log a test fills through
its port as the engine would (`insert_batch`, `claim_within`, `mark_fired`), and PostgreSQL's
clock is the harness's clock.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from scheduler.api.app import build_api
from scheduler.bus.memory import MemoryStreams, MemoryWriter, Stored
from scheduler.clock import Clock, SystemClock
from scheduler.cron.jobs import load_dir
from scheduler.leadership.partition_map import PartitionMap, build_map
from scheduler.messages.envelope import parse_envelope
from scheduler.metrics import Metrics
from scheduler.operations.activity import ActivityOperations
from scheduler.operations.backlog import WriteBacklog
from scheduler.operations.bundle import Operations
from scheduler.operations.cron_jobs import ScheduleOperations
from scheduler.operations.dead_letters import DeadLetterOperations
from scheduler.operations.records import Instance
from scheduler.operations.stats import StatsOperations
from scheduler.operations.tasks import TaskOperations
from scheduler.records import Fired, NewTask, ceil_ms
from scheduler.settings import Settings
from scheduler.store.memory import MemoryTaskStore
from scheduler.store.memory_activity import MemoryActivityStore
from scheduler.store.memory_clock import MemoryDatabaseTime
from scheduler.store.memory_dead_letters import MemoryDeadLetterStore
from scheduler.store.memory_history import MemoryFireHistory
from scheduler.store.memory_idempotency import MemoryIdempotencyStore
from scheduler.store.memory_schedules import MemoryBackfills, MemorySchedules
from scheduler.store.memory_statistics import MemoryStatistics
from scheduler.store.memory_task_reads import MemoryTaskReads
from tests.integration.api.harness import ADMIN, JOBS, READ, Reply, request_headers, write_jobs

__all__ = ["ADMIN", "READ", "EdgeOnTwins", "Reply", "edge_on_twins"]


class TwinBackend:
    """`scheduler.api.app.ApiBackend` over the twins' operations."""

    def __init__(self, settings: Settings, operations: Operations) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self._operations = operations
        self.partition_map: PartitionMap = build_map(settings.partitions, {})  # nobody holds

    @property
    def operations(self) -> Operations | None:
        return self._operations

    def is_alive(self) -> bool:
        return True

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        return True, {"status": "ready", "instance": self.settings.instance_id}

    async def leader(self) -> dict[str, Any]:
        """As the edge answers with no lease holder and no engine of its own
        (`scheduler.daemon.edge`)."""
        nobody: dict[str, Any] = {"instance": None, "epoch": None, "since": None}
        me = {"self": {"instance": self.settings.instance_id}}
        return nobody | me | self.partition_map.to_json()

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
        task_ops = TaskOperations(bus, s, self.tasks, MemoryTaskReads(self.tasks), clock)
        dead = self.dead_letters
        backfills = self.backfills
        cron_logs = [self.schedules.fire_log]
        stats = StatsOperations(
            MemoryStatistics(self.tasks, cron_logs),
            dead,
            MemoryFireHistory(self.tasks, dead, cron_logs),
            MemoryDatabaseTime(clock.now),
            clock,
            _no_lease,
            s.forecast_interval.total_seconds(),
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
        # an error the app answers 500 is not raised here: a server sends that answer
        transport = httpx.ASGITransport(
            app=self.app, raise_app_exceptions=False, client=("127.0.0.1", 50000)
        )
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            resp = await http.request(
                method, path, headers=raw_headers, json=json_body, content=data, params=query
            )
        try:
            body = json.loads(resp.content) if resp.content else None
        except ValueError:
            body = None
        return Reply(resp.status_code, resp.headers, body)  # by name in any case, as aiohttp's

    async def store_task(self, target: str, doc: dict[str, Any]) -> NewTask:
        """Store the task a producer published for `target` as the engine's intake stores it
        (`scheduler.engine.delayed.intake`: the envelope's id, priority, expiry and org, due
        at its `delay_until` rounded up to the millisecond, or now): no engine takes it off
        the lane here."""
        raw = json.dumps(doc).encode()
        now = self.clock.now()
        env = parse_envelope(raw, now)
        due = ceil_ms(env.due_at(now))
        task = NewTask(
            env.id, target, raw, {}, env.priority, due, due, env.expires_at, org_id=env.org_id
        )
        inserted = await self.tasks.insert_batch([task])
        assert [r.task_id for r in inserted.stored] == [env.id], inserted
        return task

    async def fire(self, *fired: tuple[str, datetime]) -> None:
        """Deliver tasks (id, when) as the leader does, through the engine's port: claimed by
        the harness's epoch, published to TASKS (stream sequences counted from 1 per call),
        then recorded fired."""
        epoch = self.tasks.epoch or await self.tasks.take_office(self.settings.instance_id)
        ids = [task_id for task_id, _ in fired]
        until = max(at for _, at in fired)
        claimed = await self.tasks.claim_within(epoch, ids, until, 2**62)
        by_id = {t.id: t for t in claimed.ready}
        assert sorted(by_id) == sorted(ids), f"not due, or not pending: {ids}"
        done = [Fired(by_id[i], at, "TASKS", n) for n, (i, at) in enumerate(fired, 1)]
        await self.tasks.mark_fired(epoch, done, self.settings.instance_id)

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
