"""The firing engine's real parts for engine-level tests: PostgreSQL store, NATS publisher, a
fixed office and a target stream, wired as `LeaderEngine.run_term` wires them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import nats
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from scheduler.bus.nats.publisher import Publisher
from scheduler.clock import Clock, SystemClock
from scheduler.engine.delayed.dispatch import Dispatcher
from scheduler.engine.delayed.horizon import Horizon, HorizonHeap
from scheduler.engine.office import FixedOffice
from scheduler.metrics import Metrics
from scheduler.records import NewTask, ceil_ms
from scheduler.settings import Settings
from scheduler.store.postgres import task_states
from scheduler.store.postgres.connect import PostgresStore, create_pool
from scheduler.store.postgres.epoch import take_office
from scheduler.store.postgres.tasks import TaskStore
from tests.support.stores import insert

STREAM = "ENG"
SUBJECT = "mq.eng.work"


@dataclass
class Parts:
    settings: Settings
    pool: asyncpg.Pool
    tasks: TaskStore
    nc: Client
    publisher: Publisher
    office: FixedOffice
    epoch: int
    metrics: Metrics
    clock: Clock
    heap: HorizonHeap = field(default_factory=HorizonHeap)

    def firing(self) -> Dispatcher:
        return Dispatcher(
            settings=self.settings,
            horizon=Horizon(self.heap),
            tasks=self.tasks,
            publisher=self.publisher,
            office=self.office,
            clock=self.clock,
            events=self.metrics,
        )

    async def insert(
        self, dues: list[datetime], priority: int = 5, heap: bool = False, size: int = 0
    ) -> list[NewTask]:
        """Store one task per due time (target `SUBJECT`, payloads of about `size` bytes), in
        order; with `heap`, also put them on the heap, as intake does for tasks inside the
        loaded horizon."""
        rows = []
        for due in map(ceil_ms, dues):  # whole milliseconds, as intake stores them
            task_id = f"e_{uuid.uuid4().hex}"
            doc = {"id": task_id, "delay_until": due.isoformat(), "pad": "x" * size}
            rows.append(
                NewTask(task_id, SUBJECT, json.dumps(doc).encode(), {}, priority, due, due, None)
            )
        for ref in await insert(self.tasks, rows):
            if heap:
                self.heap.push(ref)
        return rows

    async def wait_status(self, task_id: str, *wanted: str) -> str:
        """Poll until the task's status is one of `wanted` (the caller bounds the wait)."""
        while (status := await self.status(task_id)) not in wanted:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        return status

    async def stored(self, within: float = 10.0, count: int | None = None) -> list[Any]:
        """Every message of the target stream (until `count`, or quiet for 1 s)."""
        js = self.nc.jetstream()
        psub = await js.pull_subscribe(
            ">", durable=None, stream=STREAM, config=ConsumerConfig(ack_policy=AckPolicy.NONE)
        )
        out: list[Any] = []
        try:
            async with asyncio.timeout(within):
                while count is None or len(out) < count:
                    try:
                        out += await psub.fetch(500, timeout=1.0)
                    except TimeoutError:
                        if count is None:
                            break
        finally:
            await psub.unsubscribe()
        return out

    async def until_stored(self, count: int) -> None:
        """Return once the target stream holds `count` messages (the caller bounds the wait)."""
        js = self.nc.jetstream()
        while (await js.stream_info(STREAM)).state.messages < count:  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    async def status(self, task_id: str) -> str:
        return str(  # a fired task's row is gone: its tombstone says fired
            await self.pool.fetchval(
                f"SELECT coalesce((SELECT {task_states.reported()} FROM delayed_messages "
                "WHERE id = $1), "
                "(SELECT 'fired' FROM fired_tasks WHERE id = $1))",
                task_id,
            )
        )


def ids_of(msgs: list[Any]) -> Counter[str]:
    return Counter(m.headers["Nats-Msg-Id"] for m in msgs)


def early(msgs: list[Any], due: dict[str, datetime]) -> list[str]:
    """Ids stored before their due millisecond."""
    out = []
    for m in msgs:
        at = due[m.headers["Nats-Msg-Id"]]
        if m.metadata.timestamp < at.replace(microsecond=at.microsecond // 1000 * 1000):
            out.append(m.headers["Nats-Msg-Id"])
    return out


async def make_parts(
    settings: Settings, clock: Clock | None = None, publish_timeout: float = 5.0, **overrides: Any
) -> AsyncIterator[Parts]:
    s = settings.with_overrides(**overrides) if overrides else settings
    assert s.database_dsn is not None and s.nats_url is not None
    pool = await create_pool(s.database_dsn, min_size=1, max_size=4)
    nc = await nats.connect(s.nats_url)
    publisher = None
    try:
        await nc.jetstream().add_stream(
            StreamConfig(name=STREAM, subjects=["mq.eng.>"], duplicate_window=120)
        )
        publisher = await Publisher(nc, timeout=publish_timeout).start()
        metrics = Metrics()
        epoch = await take_office(pool, "engine-test")
        yield Parts(
            s,
            pool,
            TaskStore(PostgresStore(pool, metrics)),
            nc,
            publisher,
            FixedOffice(epoch),
            epoch,
            metrics,
            clock or SystemClock(),
        )
    finally:
        if publisher is not None:
            await publisher.close()
        await nc.close()
        await pool.close()


parts_of = contextlib.asynccontextmanager(make_parts)


async def run_for(firing: Dispatcher, epoch: int, until: Any, within: float = 10.0) -> None:
    """Run `firing` until the awaitable `until` completes (bounded), then stop it gracefully."""
    stop = asyncio.Event()
    runner = asyncio.create_task(firing.run(epoch, stop))
    try:
        async with asyncio.timeout(within):
            await until
    finally:
        stop.set()
        firing.wake.set()
        await asyncio.wait_for(runner, 10)


def soon(ms: int) -> datetime:
    return datetime.now(UTC) + timedelta(milliseconds=ms)
