"""The armed set: claimed tasks waiting for their due millisecond, in a total order."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.clock import FakeClock
from scheduler.engine.delayed.dispatch import Dispatcher
from scheduler.engine.delayed.horizon import Horizon
from scheduler.engine.ports import Broker
from scheduler.metrics import Metrics
from scheduler.records import ClaimedTask, from_ms, to_ms
from scheduler.settings import Settings

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def task(
    task_id: str, due_ms: int, priority: int = 5, seq: int = 0, size: int = 10, attempts: int = 1
) -> ClaimedTask:
    due = from_ms(due_ms)
    return ClaimedTask(
        id=task_id,
        target="mq.tasks.x",
        payload=b"x" * size,
        headers={},
        priority=priority,
        due_at=due,
        scheduled_for=due,
        expires_at=None,
        attempts=attempts,
        seq=seq,
    )


class Office:
    epoch = 1
    lost = asyncio.Event()

    def may_act(self) -> bool:
        return True

    async def wait_for_office(self) -> int:
        return self.epoch

    def depose(self, epoch: int | None = None) -> None:
        self.lost.set()


class CapturingPublisher:
    """Takes the batches the dispatcher hands over, with the clock's time at hand-over."""

    timeout = 5.0

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.sent: list[tuple[int, str]] = []  # (publish ms, task id)

    def may_send(self) -> bool:
        return True

    async def publish_tasks(
        self, tasks: Sequence[ClaimedTask], done: Sequence[Any], fired_at: datetime
    ) -> None:
        now = to_ms(self.clock.now())
        for task in tasks:
            self.sent.append((now, task.id))


def firing(clock: FakeClock, publisher: Any = None, **overrides: Any) -> Dispatcher:
    return Dispatcher(
        settings=Settings(**overrides),
        horizon=Horizon(),
        tasks=None,  # type: ignore[arg-type]  # no store: nothing here claims or books
        # a stand-in with only what the dispatcher calls here (timeout, may_send, publish_tasks)
        publisher=cast(Broker, publisher or CapturingPublisher(clock)),
        office=Office(),
        clock=clock,
        events=Metrics(),
    )


async def drain(f: Dispatcher, clock: FakeClock, until_ms: int) -> None:
    """Step the fake clock a millisecond at a time, publishing what is due at each step."""
    while to_ms(clock.now()) < until_ms:
        await f.publish_due()
        clock.advance(0.001)
    await f.publish_due()


async def test_rearmed_duplicates_neither_raise_nor_go_out_early() -> None:
    """The same claimed tasks armed twice (a reclaim racing a claim) among earlier and later
    ones: arming never raises, nothing is handed over before its due millisecond, each once."""
    clock = FakeClock(T0)
    f = firing(clock)
    base = to_ms(T0)
    batch = [task(f"t{i}", base + 50 + i % 7, seq=i) for i in range(40)]
    f.arm(batch)
    again = [task(t.id, to_ms(t.due_at), t.priority, t.seq, attempts=2) for t in batch]
    f.arm(again[::3])  # re-armed duplicates: the same tasks, claimed again
    f.arm([task(f"e{i}", base + 20 + i, seq=100 + i) for i in range(5)])  # an older claim
    f.arm(again[1::4])
    await drain(f, clock, base + 100)
    sent = f.publisher.sent  # type: ignore[attr-defined]
    due = {t.id: to_ms(t.due_at) for t in batch} | {f"e{i}": base + 20 + i for i in range(5)}
    assert sorted(i for _, i in sent) == sorted(due)
    assert [(at, i) for at, i in sent if at < due[i]] == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 60), max_size=25), max_size=8))
def test_any_sequence_of_arms_keeps_the_total_order(claims: list[list[int]]) -> None:
    """Whatever is armed, in whatever order and however often (each claim a list of intake
    sequence numbers; a number seen before is the same task claimed again), tasks leave in
    (due, priority, sequence) order, each id once, none before its due millisecond."""

    async def run() -> None:
        clock = FakeClock(T0)
        f = firing(clock)
        base = to_ms(T0)
        key = {seq: (base + seq % 31, 1 + seq % 10, seq) for c in claims for seq in c}
        for n, claim in enumerate(claims):
            tasks = [task(f"s{seq}", *key[seq], attempts=n + 1) for seq in claim]
            random.Random(n).shuffle(tasks)
            f.arm(tasks)
        await drain(f, clock, base + 40)
        sent = f.publisher.sent  # type: ignore[attr-defined]
        assert sorted(i for _, i in sent) == sorted(f"s{seq}" for seq in key)
        assert all(at >= key[int(i[1:])][0] for at, i in sent)
        order = [key[int(i[1:])] for _, i in sent]
        assert order == sorted(order)

    asyncio.run(run())


def test_a_later_key_never_compares_payloads() -> None:
    """Two different tasks that share due time, priority and sequence (a reclaim of rows from
    another store, say) are both armed without comparing their payloads."""
    clock = FakeClock(T0)
    f = firing(clock)
    due = to_ms(T0 + timedelta(milliseconds=5))
    f.arm([task("a", due, seq=1), task("b", due, seq=1)])
    f.arm([task("a", due, seq=1)])
    assert len(f.armed) == 2


def test_room_is_bounded_by_count_and_by_payload_bytes() -> None:
    """The set admits tasks while under both limits; one task larger than the byte limit
    still fits into an empty set (so it can be published at all), and taking tasks out
    gives the room back."""
    from scheduler.engine.delayed.armed import Armed

    armed = Armed(max_count=3, max_bytes=100)
    base = to_ms(T0)
    assert armed.room() == 3 and armed.byte_room() == 100
    armed.add([task("a", base, size=60)])
    assert armed.room() == 2 and armed.byte_room() == 40
    armed.add([task("b", base + 1, size=60)])
    assert armed.bytes == 120 and armed.room() == 0 and armed.byte_room() == 0
    assert [s[4].id for s in armed.pop_due(base)] == ["a"]
    assert armed.bytes == 60 and armed.room() == 2
    armed.clear()
    huge = Armed(max_count=10, max_bytes=10)
    assert huge.byte_room() == 10
    huge.add([task("big", base, size=1000)])
    assert huge.room() == 0 and len(huge) == 1
