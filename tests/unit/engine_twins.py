"""The delayed engine wired on the in-memory twins and a fake clock: no server, milliseconds."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from scheduler.bus.memory import MemoryBus, MemoryStreams, Stored
from scheduler.clock import FakeClock, to_rfc3339
from scheduler.engine.leader_loop import LeaderEngine
from scheduler.engine.office import FixedOffice
from scheduler.metrics import Metrics
from scheduler.settings import Settings
from scheduler.store.memory import MemoryTaskStore

T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


@dataclass
class Delivery:
    """A message on the delay lane, as the engine's `Delivery` port sees it."""

    subject: str
    data: bytes
    reply: str = ""
    headers: dict[str, str] | None = None
    termed: bool = False
    meta: Any = None  # JetStream's delivery metadata, when a test gives one

    @property
    def metadata(self) -> Any:
        if self.meta is None:
            raise AttributeError("not a JetStream message")
        return self.meta

    async def in_progress(self) -> None:
        pass

    async def term(self) -> None:
        self.termed = True


@dataclass
class Lane:
    """The delay lane's consumer (the engine's `Source` port), fed by the test."""

    queue: asyncio.Queue[Delivery] = field(default_factory=asyncio.Queue)
    rereads: int = 0  # `reread` calls (a term that grew)

    async def start(self) -> Lane:
        return self

    async def take(
        self, timeout: float, linger: float = 0.002, limit: int | None = None
    ) -> Sequence[Delivery]:
        try:
            first = await asyncio.wait_for(self.queue.get(), timeout=min(timeout, 0.05))
        except TimeoutError:
            return []
        got = [first]
        while not self.queue.empty() and (limit is None or len(got) < limit):
            got.append(self.queue.get_nowait())
        return got

    def interrupt(self) -> None:
        pass

    def reread(self) -> None:
        self.rereads += 1

    async def close(self) -> None:
        pass


class Office(FixedOffice):
    """A fixed office whose epoch the test may take away (`depose`) like a lost lease, and
    give back with a newer epoch (`retake`), as a lease lost and won again does."""

    def retake(self, epoch: int) -> None:
        self._epoch = epoch
        self._lost.clear()


@dataclass
class Engine:
    clock: FakeClock
    store: MemoryTaskStore
    streams: MemoryStreams
    bus: MemoryBus
    lane: Lane
    engine: LeaderEngine
    office: Office
    metrics: Metrics  # the engine's events listener
    stop: asyncio.Event
    runner: asyncio.Task[None] | None = None
    counter: int = 0
    sent: dict[str, Delivery] = field(default_factory=dict)  # `send`'s messages by task id

    def send(self, delay_ms: int, priority: int = 5, target: str = "inference.chat") -> str:
        """A producer's envelope on the lane, due `delay_ms` after the fake clock's now."""
        self.counter += 1
        task_id = f"task_{self.counter:04d}"
        doc = {
            "schema": "hanzo.mq.v1",
            "id": task_id,
            "type": "t",
            "source": "test",
            "timestamp": to_rfc3339(self.clock.now()),
            "priority": priority,
            "delay_until": to_rfc3339(self.clock.now() + timedelta(milliseconds=delay_ms)),
            "data": {"n": self.counter},
        }
        subject = f"mq.delay.{target}"
        msg = self.sent[task_id] = Delivery(subject, json.dumps(doc).encode(), f"ack.{task_id}")
        self.lane.queue.put_nowait(msg)
        return task_id

    def delivered(self) -> list[Stored]:
        return self.streams.messages("TASKS")

    def ids(self) -> list[str]:
        return [m.headers["Nats-Msg-Id"] for m in self.delivered()]

    async def settle(self, rounds: int = 30) -> None:
        """Let every runnable task run (no clock movement)."""
        for _ in range(rounds):
            await asyncio.sleep(0)

    async def until(
        self, check: Callable[[], bool], step_ms: int = 1, limit_ms: int = 10_000
    ) -> int:
        """Move the fake clock a step at a time until `check()` holds; the ms it took."""
        for moved in range(0, limit_ms, step_ms):
            await self.settle()
            if check():
                return moved
            self.clock.advance(step_ms / 1000)
        raise AssertionError(f"not reached within {limit_ms} ms of fake time")

    async def start(self) -> None:
        self.runner = asyncio.create_task(self.engine.run_term(self.stop))
        await self.until(lambda: bool(self.bus.publishers))

    async def close(self) -> None:
        self.stop.set()
        if self.runner is not None:
            for _ in range(200):
                if self.runner.done():
                    break
                self.clock.advance(0.05)
                await asyncio.sleep(0.005)
            self.runner.cancel()
            await asyncio.gather(self.runner, return_exceptions=True)


async def engine_on_twins(
    store: MemoryTaskStore | None = None, streams: MemoryStreams | None = None, **overrides: Any
) -> Engine:
    clock = FakeClock(T0)
    store = store or MemoryTaskStore(now=clock.now)
    if streams is None:
        streams = MemoryStreams(clock.monotonic)
        streams.add_stream("TASKS", ["mq.inference.>"])
        streams.add_stream("DLQ", ["mq.dlq.>"])
    lane = Lane()
    bus = MemoryBus(streams, lane)  # type: ignore[arg-type]  # any Source; annotated as the twin's
    settings = Settings(**overrides)
    office = Office(await store.take_office("twin"))
    metrics = Metrics()
    engine = LeaderEngine(settings, bus, store, office, clock, metrics)
    return Engine(clock, store, streams, bus, lane, engine, office, metrics, asyncio.Event())
