"""Intake's batches on a fake clock: tasks all due far ahead are gathered into one insert, a
task due soon (or a message that is no task) ends the gathering at once, and nothing is lost,
reordered, or acked before its commit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from scheduler.bus.memory import MemoryBroker, MemoryStreams
from scheduler.clock import FakeClock, to_rfc3339, wait_event
from scheduler.engine.delayed.horizon import Horizon
from scheduler.engine.delayed.intake import (
    FAILED_PAUSE,
    FAR_DUE,
    GATHER_FOR,
    INTAKE_LINGER,
    Intake,
)
from scheduler.messages.envelope import Limits
from scheduler.metrics import Metrics
from scheduler.records import Insertion, NewTask
from scheduler.settings import Settings
from scheduler.store.memory import MemoryTaskStore
from tests.unit.engine_twins import T0, Delivery

MS = 0.001


class ClockLane:
    """The delay lane's `Source` on a fake clock, as the puller behaves: `take` waits for a
    message, then lingers until the oldest buffered one is `linger` old, and hands over at
    most a batch (and `limit`), the rest left for the next take."""

    def __init__(self, clock: FakeClock, batch: int) -> None:
        self.clock, self.batch = clock, batch
        self.buffer: list[Delivery] = []
        self.first_at = 0.0
        self.arrived = asyncio.Event()

    def put(self, msg: Delivery) -> None:
        if not self.buffer:
            self.first_at = self.clock.monotonic()
            self.arrived.set()
        self.buffer.append(msg)

    async def start(self) -> ClockLane:
        return self

    async def take(
        self, timeout: float, linger: float = 0.002, limit: int | None = None
    ) -> Sequence[Delivery]:
        most = self.batch if limit is None else min(limit, self.batch)
        if not self.buffer:
            self.arrived.clear()
            await wait_event(self.clock, self.arrived, timeout)
        if self.buffer and len(self.buffer) < most and linger > 0:
            await self.clock.sleep(self.first_at + linger - self.clock.monotonic())
        out, self.buffer = self.buffer[:most], self.buffer[most:]
        return out

    def interrupt(self) -> None:
        self.arrived.set()

    def reread(self) -> None:
        pass

    async def close(self) -> None:
        self.closed = True

    closed = False


@dataclass
class Inserts(MemoryTaskStore):
    """The twin store, noting when each insert ran (fake monotonic time) and what it held;
    `gate`, while clear, holds every insert before it commits."""

    clock: FakeClock = field(default_factory=FakeClock)
    calls: list[tuple[float, list[str]]] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def insert_batch(self, tasks: Sequence[NewTask]) -> Insertion:
        self.calls.append((self.clock.monotonic(), [t.id for t in tasks]))
        await self.gate.wait()
        return await super().insert_batch(tasks)


@dataclass
class Rig:
    clock: FakeClock
    lane: ClockLane
    store: Inserts
    broker: MemoryBroker
    stop: asyncio.Event
    counter: int = 0
    arrived: dict[str, float] = field(default_factory=dict)
    sent: dict[str, bytes] = field(default_factory=dict)

    def send(self, due_in: timedelta, valid: bool = True) -> str:
        """A producer's envelope on the lane now, due `due_in` from now (or not JSON)."""
        self.counter += 1
        task_id = f"task_{self.counter:04d}"
        doc: dict[str, Any] = {
            "schema": "hanzo.mq.v1",
            "id": task_id,
            "type": "t",
            "source": "test",
            "timestamp": to_rfc3339(self.clock.now()),
            "delay_until": to_rfc3339(self.clock.now() + due_in),
            "data": {"n": self.counter},
        }
        data = json.dumps(doc).encode() if valid else b"not json"
        self.sent[task_id] = data
        self.lane.put(Delivery("mq.delay.inference.chat", data, f"ack.{task_id}"))
        self.arrived[task_id] = self.clock.monotonic()
        return task_id

    async def run_for(self, ms: int) -> None:
        """Move the fake clock `ms` milliseconds, one at a time, letting everything run."""
        for _ in range(ms):
            for _ in range(20):
                await asyncio.sleep(0)
            self.clock.advance(MS)

    def stored_at(self, task_id: str) -> float:
        return next(at for at, ids in self.store.calls if task_id in ids)


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    yield await make_rig()


async def make_rig(**overrides: Any) -> Rig:
    clock = FakeClock(T0)
    lane = ClockLane(clock, Settings(**overrides).batch)
    store = Inserts(now=clock.now, clock=clock)
    store.gate.set()
    broker = MemoryBroker(MemoryStreams(clock.monotonic))
    return Rig(clock, lane, store, broker, asyncio.Event())


async def running(rig: Rig, **overrides: Any) -> asyncio.Task[None]:
    intake = Intake(
        settings=Settings(**overrides),
        horizon=Horizon(),
        tasks=rig.store,
        publisher=rig.broker,
        clock=rig.clock,
        events=Metrics(),
        limits=Limits(),
    )
    return asyncio.create_task(intake.run(rig.lane, rig.stop, lambda: True))


async def stopped(rig: Rig, runner: asyncio.Task[None]) -> None:
    rig.stop.set()
    async with asyncio.timeout(3):
        while not runner.done():
            await rig.run_for(1)
    await runner


FAR = FAR_DUE + timedelta(seconds=59)


async def test_tasks_due_far_ahead_are_gathered_into_one_insert(rig: Rig) -> None:
    """Ten tasks due a minute ahead, arriving 4 ms apart over 36 ms, go into one insert once
    the first has waited `GATHER_FOR` (not one insert per 10 ms), in lane order; each is
    acked after it."""
    runner = await running(rig)
    sent = []
    for _ in range(10):
        sent.append(rig.send(FAR))
        await rig.run_for(4)
    await rig.run_for(30)
    assert [ids for _, ids in rig.store.calls] == [sent]
    at, _ = rig.store.calls[0]
    waited = at - rig.arrived[sent[0]]
    assert GATHER_FOR - 2 * MS <= waited <= GATHER_FOR + 2 * MS
    assert rig.broker.acked == [f"ack.{t}" for t in sent]
    await stopped(rig, runner)


async def test_a_task_due_soon_ends_the_gathering_at_once(rig: Rig) -> None:
    """A task due within `FAR_DUE` among far ones is stored one linger after it came, with
    those before it; the tasks after it start a batch of their own, nothing lost or
    reordered."""
    runner = await running(rig)
    far = [rig.send(FAR), rig.send(FAR)]
    await rig.run_for(14)
    soon = rig.send(FAR_DUE - timedelta(milliseconds=100))
    await rig.run_for(16)
    after = rig.send(FAR)
    await rig.run_for(80)
    assert [ids for _, ids in rig.store.calls] == [[*far, soon], [after]]
    assert rig.stored_at(soon) - rig.arrived[soon] <= INTAKE_LINGER + 2 * MS
    assert rig.stored_at(after) - rig.arrived[after] >= GATHER_FOR - 2 * MS
    assert rig.broker.acked == [f"ack.{t}" for t in (*far, soon, after)]
    await stopped(rig, runner)


async def test_a_task_due_now_waits_only_the_linger(rig: Rig) -> None:
    """A lone task due at once is stored `INTAKE_LINGER` after it came, not `GATHER_FOR`."""
    runner = await running(rig)
    now = rig.send(timedelta(0))
    await rig.run_for(60)
    assert [ids for _, ids in rig.store.calls] == [[now]]
    assert rig.stored_at(now) - rig.arrived[now] <= INTAKE_LINGER + 2 * MS
    await stopped(rig, runner)


async def test_a_message_that_is_no_task_ends_the_gathering(rig: Rig) -> None:
    """A message that fails validation among far tasks is dead-lettered without waiting for
    more: its batch commits one linger after it came."""
    runner = await running(rig)
    far = rig.send(FAR)
    await rig.run_for(14)
    bad = rig.send(FAR, valid=False)
    await rig.run_for(60)
    assert [ids for _, ids in rig.store.calls] == [[far]]
    assert rig.stored_at(far) - rig.arrived[bad] <= INTAKE_LINGER + 2 * MS
    assert [d["reason"] for d in rig.store.dead_letters] == ["unparseable"]
    await stopped(rig, runner)


async def test_gathering_stops_at_a_whole_batch_in_lane_order() -> None:
    """Twelve far tasks at once with a batch of five: inserts of five, five and two, in lane
    order, each taking no more than the batch."""
    rig = await make_rig(batch=5)
    runner = await running(rig, batch=5)
    sent = [rig.send(FAR) for _ in range(12)]
    await rig.run_for(120)
    assert [ids for _, ids in rig.store.calls] == [sent[:5], sent[5:10], sent[10:]]
    assert rig.broker.acked == [f"ack.{t}" for t in sent]
    await stopped(rig, runner)


async def test_a_gathered_batch_is_acked_only_after_its_commit(rig: Rig) -> None:
    """While the insert of a gathered batch has not returned, none of its messages is acked."""
    rig.store.gate.clear()
    runner = await running(rig)
    sent = [rig.send(FAR) for _ in range(3)]
    await rig.run_for(70)
    assert [ids for _, ids in rig.store.calls] == [sent]
    assert rig.broker.acked == []
    rig.store.gate.set()
    await rig.run_for(1)
    assert rig.broker.acked == [f"ack.{t}" for t in sent]
    await stopped(rig, runner)


async def test_what_comes_while_a_commit_runs_waits_for_it_in_one_batch(rig: Rig) -> None:
    """While one insert is held, tasks due at once keep arriving in chunks over 40 ms: they all
    go into the next insert (one, not one per chunk) as soon as the first returns, in lane
    order; an exact copy of the held task among them is acked once that task is committed,
    never inserted; and past the hold a lone task waits only its linger again."""
    rig.store.gate.clear()
    runner = await running(rig)
    first = rig.send(timedelta(0))
    await rig.run_for(15)
    assert [ids for _, ids in rig.store.calls] == [[first]]
    later = []
    for _ in range(4):
        later.append(rig.send(timedelta(0)))
        await rig.run_for(10)
    rig.lane.put(Delivery("mq.delay.inference.chat", rig.sent[first], "ack.copy"))
    await rig.run_for(5)
    assert len(rig.store.calls) == 1  # nothing commits while the first insert is held
    rig.store.gate.set()
    await rig.run_for(5)
    assert [ids for _, ids in rig.store.calls] == [[first], later]
    assert sorted(rig.broker.acked) == sorted(f"ack.{t}" for t in (first, *later, "copy"))
    await rig.run_for(30)
    alone = rig.send(timedelta(0))
    await rig.run_for(30)
    assert rig.store.calls[-1][1] == [alone]
    assert rig.stored_at(alone) - rig.arrived[alone] <= INTAKE_LINGER + 2 * MS
    await stopped(rig, runner)


async def test_an_intake_out_of_office_lets_go_of_the_lane_before_anything_else(rig: Rig) -> None:
    """Office ends while a batch's commit hangs, and the term's end then cancels the intake:
    the lane is closed (its pull requests withdrawn, its buffer nak'ed) all the same, so the
    server hands the next messages to the successor at once, not after the ack wait."""
    acting = [True]
    intake = Intake(
        settings=Settings(),
        horizon=Horizon(),
        tasks=rig.store,
        publisher=rig.broker,
        clock=rig.clock,
        events=Metrics(),
        limits=Limits(),
    )
    runner = asyncio.create_task(intake.run(rig.lane, rig.stop, lambda: acting[0]))
    rig.store.gate.clear()  # the commit hangs (PostgreSQL slow)
    rig.send(timedelta(seconds=1))
    await rig.run_for(20)
    assert len(rig.store.calls) == 1
    acting[0] = False  # self-fenced
    await rig.run_for(600)
    runner.cancel()  # the term ends: the engine's task group cancels its tasks
    async with asyncio.timeout(3):
        await asyncio.gather(runner, return_exceptions=True)
    assert rig.lane.closed
    rig.store.gate.set()


@dataclass
class FailingOnce(Inserts):
    """The twin store whose first insert fails (PostgreSQL away, or the link down for the acks)."""

    failed: int = 0

    async def insert_batch(self, tasks: Sequence[NewTask]) -> Insertion:
        if not self.failed:
            self.failed = 1
            self.calls.append((self.clock.monotonic(), [t.id for t in tasks]))
            raise ConnectionError("store away")
        return await super().insert_batch(tasks)


async def _failing_rig() -> tuple[Rig, FailingOnce]:
    rig = await make_rig()
    store = FailingOnce(now=rig.clock.now, clock=rig.clock)
    store.gate.set()
    rig.store = store
    return rig, store


async def test_after_a_failed_commit_the_next_waits_out_the_pause_from_the_failure() -> None:
    """A batch right behind a failed commit waits until `FAILED_PAUSE` after the failure (the
    store is not asked in a loop); one that comes seconds after it (a lane quiet through an
    outage) is stored after its linger alone, not a whole pause late (seen on CI: 1 s)."""
    rig, store = await _failing_rig()
    runner = await running(rig)
    lost = rig.send(timedelta(0))
    await rig.run_for(20)
    failed_at = rig.store.calls[0][0]
    right_behind = rig.send(timedelta(0))
    await rig.run_for(1200)
    stored = rig.stored_at(right_behind)
    assert FAILED_PAUSE - 5 * MS <= stored - failed_at <= FAILED_PAUSE + 20 * MS
    await rig.run_for(3000)  # quiet: then one more batch fails, and a task comes 5 s later
    store.failed = 0
    rig.send(timedelta(0))
    await rig.run_for(20)
    await rig.run_for(5000)
    late = rig.send(timedelta(0))
    await rig.run_for(60)
    assert late in {i for _, ids in rig.store.calls for i in ids}
    assert rig.stored_at(late) - rig.arrived[late] <= INTAKE_LINGER + 5 * MS
    assert f"ack.{lost}" not in rig.broker.acked  # never acked: it comes back after ack wait
    await stopped(rig, runner)
