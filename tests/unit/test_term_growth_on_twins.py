"""A term that gains partitions in place, on the twins (fake clock): it keeps firing its own
partitions without ending, and fires every task of the gained ones exactly once, whether due
before the gain, up to the loader's cursor or past it (docs/leadership.md, "A term that
grows")."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest

from scheduler.engine.delayed import stored
from scheduler.partitions import partition_of
from scheduler.records import Claimed, NewTask, to_ms
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

    async def resized(self, epoch: int) -> frozenset[int]:
        self.partitions = self.store.owned = await self.growths.get()  # as the daemon's on_term
        return self.partitions

    def resize_applied(self, epoch: int, ok: bool) -> None:
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


async def test_a_term_split_for_catch_up_grows_and_fires_each_gained_task_once() -> None:
    """With catch-up on and a backlog split off (two cursors), a gain still joins the running
    term: each gained task goes to the range its key falls in (the backlog's, read later by
    its loader when past its cursor), and every task, kept or gained, fires once."""
    twin, office = await growing_twin(catchup="on_time_first")
    late = ids_in(MINE, "late", 3_000)
    await store(twin, late, -60_000)  # overdue by a minute: a backlog
    gained_late = ids_in(GAINED, "glate", 20)
    await store(twin, gained_late, -30_000)  # the gained partitions' part of it
    gained_soon = ids_in(GAINED, "gsoon", 20)
    await store(twin, gained_soon, 3_000)
    claim = twin.store.claim_within

    async def slow_claim(epoch: int, ids: Sequence[str], until: datetime, budget: int) -> Claimed:
        await twin.clock.sleep(0.02)  # the backlog lasts a few claims, so the gain meets it
        return await claim(epoch, ids, until, budget)

    twin.store.claim_within = slow_claim  # type: ignore[method-assign]
    await twin.start()
    try:
        await twin.until(lambda: twin.engine.horizon.backlog is not None, limit_ms=1_000)
        office.growths.put_nowait(MINE | GAINED)
        await twin.until(lambda: bool(office.answers), limit_ms=500)
        assert office.answers == [True]
        listening = {s for s, _ in twin.bus.listeners if s.startswith(stored.SUBJECT_PREFIX)}
        assert listening == {stored.subject(p) for p in MINE | GAINED}
        wanted = set(late + gained_late + gained_soon)

        def all_fired() -> bool:
            twin.engine.horizon.hungry.set()  # as in the test above: the loader's real second
            return wanted <= set(twin.ids())

        await twin.until(all_fired, step_ms=5, limit_ms=20_000)
        fired = twin.ids()
        assert sorted(fired) == sorted(wanted), "each task once"
        assert not office.ended
    finally:
        await twin.close()


async def test_a_gained_backlog_goes_out_beside_the_tasks_the_term_already_fires() -> None:
    """A dead engine's partitions come with 3,000 tasks already due (each claim a 20 ms round
    trip of fake time, as under load, 50 a claim): the growth splits them off as a backlog whatever
    `SCHEDULER_CATCHUP` says (due order here), so the term's own tasks falling due meanwhile
    go out on time, not after the backlog (issue 37: a dead engine stalls only its own
    share); the backlog still goes out whole, once each, in firing order, and the horizon is
    one range again once it is out."""
    twin, office = await growing_twin(batch=50)
    assert twin.engine.settings.catchup == "due_order"
    backlog = ids_in(GAINED, "dead", 3_000)
    own = ids_in(MINE, "own", 20)
    for n, task_id in enumerate(backlog):  # due 2 s before the gain at 1 s, in this order
        await store(twin, [task_id], -1_000 + n // 100)
    for n, task_id in enumerate(own):  # due from 10 ms after the gain, 5 ms apart
        await store(twin, [task_id], 1_010 + 5 * n)
    claim = twin.store.claim_within

    async def slow_claim(epoch: int, ids: Sequence[str], until: datetime, budget: int) -> Claimed:
        await twin.clock.sleep(0.02)
        return await claim(epoch, ids, until, budget)

    twin.store.claim_within = slow_claim  # type: ignore[method-assign]
    await twin.start()
    try:
        await twin.until(lambda: twin.clock.now() >= T0 + timedelta(seconds=1))
        office.growths.put_nowait(MINE | GAINED)
        wanted = set(backlog + own)

        def all_fired() -> bool:
            twin.engine.horizon.hungry.set()
            return wanted <= set(twin.ids())

        await twin.until(all_fired, limit_ms=20_000)
        await twin.until(lambda: twin.engine.horizon.backlog is None, limit_ms=2_000)
    finally:
        await twin.close()
    assert office.answers == [True]
    fired = twin.ids()
    assert sorted(fired) == sorted(wanted), "each task once"
    assert [i for i in fired if i in set(backlog)] == backlog, "the backlog in firing order"
    late = {
        m.headers["Nats-Msg-Id"]: (
            datetime.fromisoformat(m.headers["Mq-Fired-At"])
            - datetime.fromisoformat(m.headers["Mq-Scheduled-For"])
        )
        for m in twin.delivered()
    }
    worst = max(late[i] for i in own)  # in due order: 219 ms (seen), behind the backlog
    assert worst <= timedelta(milliseconds=10), f"own tasks up to {worst} late"


@pytest.mark.parametrize("catchup", ["due_order", "on_time_first"])
async def test_a_capped_backlog_waits_for_room_instead_of_polling(catchup: str) -> None:
    """While a split backlog's armed share is used (here by claims in flight, each a 20 ms
    round trip of fake time) and nothing of the present is due, the claim loop sleeps until
    the dispatcher publishes: it looked again every millisecond before (210 empty looks in the
    231 ms the 3,000 tasks took, seen; 10 now, in the same time), and the backlog still goes
    out whole, in firing order."""
    twin, office = await growing_twin(batch=100, catchup=catchup)
    backlog = ids_in(GAINED, "dead", 3_000)
    for n, task_id in enumerate(backlog):  # due 2 s before the gain at 1 s, in this order
        await store(twin, [task_id], -1_000 + n // 100)
    claim = twin.store.claim_within

    async def slow_claim(epoch: int, ids: Sequence[str], until: datetime, budget: int) -> Claimed:
        await twin.clock.sleep(0.02)
        return await claim(epoch, ids, until, budget)

    twin.store.claim_within = slow_claim  # type: ignore[method-assign]
    horizon = twin.engine.horizon
    take_due = horizon.take_due
    empty = 0

    def counted(until_ms: int, limit: int, backlog_limit: int | None = None) -> list[Any]:
        nonlocal empty
        out = take_due(until_ms, limit, backlog_limit)
        first = horizon.backlog.next_due_ms() if horizon.backlog is not None else None
        if not out and first is not None and first <= to_ms(twin.clock.now()):
            empty += 1  # a look that found the backlog due and could take none of it
        return out

    horizon.take_due = counted  # type: ignore[method-assign]
    await twin.start()
    try:
        await twin.until(lambda: twin.clock.now() >= T0 + timedelta(seconds=1))
        office.growths.put_nowait(MINE | GAINED)

        def all_fired() -> bool:
            horizon.hungry.set()
            return set(backlog) <= set(twin.ids())

        took = await twin.until(all_fired, limit_ms=20_000)
    finally:
        await twin.close()
    assert office.answers == [True]
    assert [i for i in twin.ids() if i in set(backlog)] == backlog, "once each, in order"
    assert empty <= took // 10, f"{empty} empty looks in {took} ms"
