"""A running daemon with a hostile producer: raw frames in, deliveries and dead letters out.

Shared by the hostile-intake regression tests and the intake property test.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import nats
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from scheduler.bus.nats.connection import ensure_stream, stream_configs
from scheduler.daemon.lifecycle import Daemon
from scheduler.settings import Settings
from tests.integration.test_delayed import envelope as envelope  # re-exported
from tests.support.helpers import DaemonRunner
from tests.support.rawclient import RawClient

TARGET = "mq.tasks.work"
LANE = b"mq.delay.tasks.work"


class Reader:
    """Reads a stream from its first message (no acks), message by message."""

    def __init__(self, js: Any, stream: str) -> None:
        self.js, self.stream = js, stream
        self.sub: Any = None
        self.seen: list[Msg] = []

    async def open(self) -> Reader:
        config = ConsumerConfig(
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.ALL,
            inactive_threshold=300.0,  # the server drops an ephemeral consumer idle for 5 s
        )
        self.sub = await self.js.pull_subscribe(
            ">", durable=None, stream=self.stream, config=config
        )
        return self

    async def take(self, count: int, within: float = 5.0) -> list[Msg]:
        """The next `count` messages; fewer when `within` seconds pass first. Bounded by the
        fetch's own timeout, never by cancelling it: a fetch cancelled after its first message
        came drops what it had gathered (this consumer acks nothing, so it never comes back)."""
        out: list[Msg] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while len(out) < count and (left := deadline - loop.time()) > 0:
            try:
                out += await self.sub.fetch(count - len(out), timeout=min(max(left, 0.05), 1.0))
            except TimeoutError:
                continue
        self.seen += out
        return out

    async def close(self) -> None:
        if self.sub is not None:
            await self.sub.unsubscribe()


class Hostile(DaemonRunner):
    """The daemon under attack, a well-behaved producer, a raw one, and readers of the
    target stream `TASKS` and the dead-letter stream `MQ_DLQ`."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.nc: Any = None
        self.js: Any = None
        self.raw: RawClient | None = None
        self.tasks: Reader | None = None
        self.dlq: Reader | None = None

    async def prepare(self) -> None:
        """Create the delay lane and dead-letter streams as the daemon would, so messages can
        wait on the lane before it starts (and arrive in one fetched batch)."""
        for config in stream_configs(self.settings, embedded=False):
            await ensure_stream(self.js, config)

    async def begin(self, **overrides: Any) -> Daemon:
        daemon = await self.start(**overrides)
        self.tasks = await Reader(self.js, "TASKS").open()
        self.dlq = await Reader(self.js, self.daemon_settings.dlq_stream).open()
        return daemon

    @property
    def daemon_settings(self) -> Settings:
        assert self.daemon is not None
        return self.daemon.settings

    async def control(self, delay: float = 0.2) -> tuple[str, datetime]:
        """A well-formed task due `delay` seconds from now; returns its id and due time."""
        due = datetime.now(UTC) + timedelta(seconds=delay)
        doc = envelope(due)
        await self.js.publish(
            "mq.delay.tasks.work", json.dumps(doc).encode(), headers={"Nats-Msg-Id": doc["id"]}
        )
        return doc["id"], due

    async def expect_delivered(self, task_id: str, due: datetime, late: float = 3.0) -> Msg:
        """The next delivery is `task_id`, not before `due` and at most `late` s after it."""
        assert self.tasks is not None
        got = await self.tasks.take(1, within=late + 2)
        assert got, f"task {task_id} was not delivered"
        msg = got[0]
        assert msg.headers is not None and msg.headers["Nats-Msg-Id"] == task_id
        arrived = msg.metadata.timestamp
        assert due - timedelta(milliseconds=1) <= arrived <= due + timedelta(seconds=late)
        return msg

    async def publish_raw(self, subject: bytes, payload: bytes, headers: bytes | None) -> Any:
        assert self.raw is not None
        return await self.raw.publish(subject, payload, headers)

    async def dead_rows(self, database_url: str) -> list[asyncpg.Record]:
        conn = await asyncpg.connect(database_url)
        try:
            return list(
                await conn.fetch(
                    "SELECT original_id, subject, reason, error, stage, headers, payload, raw, "
                    "raw_size, raw_truncated FROM dead_letters ORDER BY last_failed"
                )
            )
        finally:
            await conn.close()

    async def close(self) -> None:
        try:
            for reader in (self.tasks, self.dlq):
                if reader is not None:
                    await reader.close()
        finally:
            await self.stop()


@asynccontextmanager
async def hostile(settings: Settings) -> AsyncIterator[Hostile]:
    """A Hostile harness with the target stream `TASKS` on `mq.tasks.>`; torn down after."""
    h = Hostile(settings.with_overrides(backoff=timedelta(milliseconds=100)))
    h.nc = await nats.connect(settings.nats_servers)
    h.js = h.nc.jetstream()
    await h.js.add_stream(name="TASKS", subjects=["mq.tasks.>"], duplicate_window=120)
    try:
        async with RawClient(settings.nats_url or "") as raw:
            h.raw = raw
            yield h
    finally:
        try:
            await h.close()
        finally:
            await h.nc.close()
