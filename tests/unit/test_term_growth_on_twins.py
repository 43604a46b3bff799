"""A term that gains partitions in place, on the twins (fake clock): it keeps firing its own
partitions without ending, and fires every task of the gained ones exactly once, whether due
before the gain, up to the loader's cursor or past it (docs/leadership.md, "A term that
grows")."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import timedelta
from typing import Any

import pytest

from scheduler.engine.delayed import stored
from scheduler.partitions import partition_of
from scheduler.records import NewTask, to_ms
from scheduler.store.memory import MemoryTaskStore
from tests.unit.engine_twins import T0, Engine, Office, engine_on_twins

P = 8
MINE = frozenset({0, 1, 2})
GAINED = frozenset({3, 4})


class GrowingOffice(Office):
    """The twin's office holding some of P partitions in one term, which the test grows."""

    def __init__(self, epoch: int, partitions: frozenset[int], store: MemoryTaskStore) -> None:
        super().__init__(epoch)
        self.store = store
        self.partitions = store.owned = partitions
        self.handover = asyncio.Event()
        self.growths: asyncio.Queue[frozenset[int]] = asyncio.Queue()
        self.answers: list[bool] = []
        self.ended: list[int] = []

    def partitions_of(self, epoch: int) -> frozenset[int] | None:
        return self.partitions

    def term_ended(self, epoch: int) -> None:
        self.ended.append(epoch)

    async def grown(self, epoch: int) -> frozenset[int]:
        self.partitions = self.store.owned = await self.growths.get()  # as the daemon's on_term
        return self.partitions

    def growth_applied(self, epoch: int, ok: bool) -> None:
        self.answers.append(ok)


async def growing_twin(**settings: Any) -> tuple[Engine, GrowingOffice]:
    twin = await engine_on_twins(partitions=P, horizon=timedelta(seconds=10), **settings)
    twin.store.partitions = P
    office = GrowingOffice(await twin.store.take_office("twin"), MINE, twin.store)
    twin.engine.office = twin.office = office
    return twin, office


def ids_in(partitions: frozenset[int], prefix: str, n: int) -> list[str]:
    found = (f"{prefix}{i}" for i in range(10_000))
    return [k for k in found if partition_of(k, P) in partitions][:n]


async def store(twin: Engine, ids: list[str], after_ms: int) -> None:
    """Tasks stored straight in the twin's store (as another engine's intake would), due
    `after_ms` after T0, 10 ms apart."""
    doc = json.dumps({"schema": "hanzo.mq.v1", "id": "x", "type": "t", "source": "x", "data": {}})
    tasks = []
    for n, task_id in enumerate(ids):
        due = T0 + timedelta(milliseconds=after_ms + 10 * n)
        tasks.append(NewTask(task_id, "mq.inference.chat", doc.encode(), {}, 5, due, due, None))
    await twin.store.insert_batch(tasks)


async def test_a_gain_joins_the_running_term_and_fires_every_gained_task_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Gaining partitions 3 and 4 at 1 s: the term neither ends nor stops firing its own
    partitions; the gained tasks already overdue fire at once, those up to the cursor (due
    within the horizon) and past it (due later) on time, each once; the other partitions'
    never; it listens to the gained partitions' notices from then on, and has the lane read
    back what nobody acknowledged."""
    twin, office = await growing_twin()
    kept = ids_in(MINE, "k", 30)
    overdue, below, above = (ids_in(GAINED, p, 10) for p in ("o", "b", "a"))
    others = ids_in(frozenset(range(5, P)), "x", 10)
    await store(twin, kept, 200)
    await store(twin, overdue + others, 100)
    await store(twin, below, 4_000)
    await store(twin, above, 15_000)  # past the 10 s horizon: the loader reads them later
    await twin.start()
    try:
        await twin.until(lambda: twin.clock.now() >= T0 + timedelta(seconds=1))
        assert not set(overdue) & set(twin.ids())
        cursor = twin.engine.horizon.heap.cursor
        assert to_ms(T0 + timedelta(seconds=4)) < cursor[0] < to_ms(T0 + timedelta(seconds=15))
        with caplog.at_level(logging.INFO):
            office.growths.put_nowait(MINE | GAINED)
            took = await twin.until(lambda: set(overdue) <= set(twin.ids()), limit_ms=500)
        assert took <= 50, f"the overdue gained tasks fired {took} ms after the gain"
        assert office.answers == [True]
        assert twin.lane.rereads == 1  # a dead engine's intake batch in flight: read back
        listening = {s for s, _ in twin.bus.listeners if s.startswith(stored.SUBJECT_PREFIX)}
        assert listening == {stored.subject(p) for p in MINE | GAINED}
        wanted = set(kept + overdue + below + above)

        def all_fired() -> bool:
            # the loader waits for a second of real time between pages, the fake clock runs
            # faster: wake it as the claimer would once it has room
            twin.engine.horizon.hungry.set()
            return wanted <= set(twin.ids())

        await twin.until(all_fired, step_ms=5, limit_ms=20_000)
        fired = twin.ids()
        assert sorted(fired) == sorted(wanted), "each gained and kept task once, no other"
        assert not office.ended and twin.runner is not None and not twin.runner.done()
        assert "engine.term_ended" not in caplog.text
        assert "engine.partitions_grown gained=[3, 4]" in caplog.text
    finally:
        await twin.close()
    assert office.ended == [office.epoch or office.ended[0]]


async def test_a_term_split_for_catch_up_does_not_grow() -> None:
    """With catch-up on and a backlog split off (two cursors), the engine answers that it did
    not grow, before changing anything: the office then hands the term over."""
    twin, office = await growing_twin(catchup="on_time_first")
    await store(twin, ids_in(MINE, "late", 3_000), -60_000)  # overdue by a minute: a backlog
    await twin.start()
    try:
        await twin.until(lambda: twin.engine.horizon.backlog is not None, limit_ms=1_000)
        office.growths.put_nowait(MINE | GAINED)
        await twin.settle()
        assert twin.engine.horizon.backlog is not None  # (still split when the growth came)
        await twin.until(lambda: bool(office.answers), limit_ms=500)
        assert office.answers == [False]
        listening = {s for s, _ in twin.bus.listeners if s.startswith(stored.SUBJECT_PREFIX)}
        assert listening == {stored.subject(p) for p in MINE}
    finally:
        await twin.close()
