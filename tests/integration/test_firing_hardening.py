"""The firing engine under duress, on real PostgreSQL and nats-server: re-armed duplicates,
acks that never come, a full armed set."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from datetime import timedelta
from typing import Any

import nats
import pytest

from scheduler.engine.office import FixedOffice
from scheduler.records import ClaimedTask, to_ms
from scheduler.settings import Settings
from scheduler.store.postgres.epoch import take_office
from tests.faults.proxy import FaultProxy
from tests.integration.engine_parts import (
    STREAM,
    Parts,
    early,
    ids_of,
    make_parts,
    parts_of,
    run_for,
    soon,
)
from tests.support.stores import claim


@pytest.fixture
async def parts(settings: Settings) -> AsyncIterator[Parts]:
    async for p in make_parts(settings):
        yield p


async def test_rearmed_claims_go_out_once_and_never_early(parts: Parts) -> None:
    """Claimed tasks armed again by a reclaim (same rows) and by a second claim (the first
    one's reply lost, so a higher attempt) among later ones: all arrive once, none early."""
    dues = [soon(600 + (i * 7) % 300) for i in range(300)]
    rows = await parts.insert(dues)
    due = {t.id: t.due_at for t in rows}
    ids = [t.id for t in rows]
    firing = parts.firing()
    firing.arm(await claim(parts.tasks, parts.epoch, ids, soon(5000)))
    firing.arm((await parts.tasks.reclaim_orphans(parts.epoch, timedelta(0))).ready)
    await parts.pool.execute(  # claimable again (a claim is `claimed_epoch` set)
        "UPDATE delayed_messages SET claimed_epoch = NULL WHERE id = ANY($1)", ids[::5]
    )
    firing.arm(await claim(parts.tasks, parts.epoch, ids[::5], soon(5000)))
    await run_for(firing, parts.epoch, parts.until_stored(len(rows)))
    msgs = await parts.stored(count=len(rows))
    assert ids_of(msgs) == dict.fromkeys(ids, 1)
    assert early(msgs, due) == []


@pytest.fixture
async def proxied(settings: Settings, nats_url: str) -> AsyncIterator[tuple[Parts, FaultProxy]]:
    """Parts whose publishes go through a fault proxy; acks time out after one second."""
    port = int(nats_url.rsplit(":", 1)[1])
    proxy = await FaultProxy("127.0.0.1", port).start()
    try:
        s = settings.with_overrides(nats_url=proxy.url, backoff=timedelta(milliseconds=300))
        async for p in make_parts(s, publish_timeout=1.0):
            p.heap.loaded([], to_ms(soon(3_600_000)))  # as if loaded: retries go on the heap
            yield p, proxy
    finally:
        await proxy.close()


async def test_an_unacknowledged_delivery_is_in_doubt_not_pending(
    proxied: tuple[Parts, FaultProxy], nats_url: str
) -> None:
    """Two deliveries reach the stream but their acks are lost (the link goes silent right
    after they pass): both tasks are in doubt, so a cancel answers `in_flight` (never
    `cancelled`: they are stored) and a reschedule answers `in_flight` (never moved, so never
    delivered twice). Once the link heals they are republished with the same ids, the stream
    drops the repeats, and both end `fired`, once each in the stream."""
    parts, proxy = proxied

    def cut_after_delivery(connection: int, data: bytes) -> None:
        if b"HPUB mq.eng." in data:
            proxy.blackhole()  # this chunk still goes through; the acks will not come back
            proxy.tap = None

    proxy.tap = cut_after_delivery
    keep, move = await parts.insert([soon(300), soon(300)], heap=True)
    firing = parts.firing()

    async def answers() -> tuple[str, str]:
        await parts.wait_status(keep.id, "claimed")
        await parts.wait_status(keep.id, "pending", "in_doubt")  # the ack timed out: booked
        await parts.wait_status(move.id, "pending", "in_doubt")
        cancelled = await parts.tasks.cancel(keep.id, keep.target)
        moved, _ = await parts.tasks.reschedule(move.id, move.target, soon(200))
        proxy.heal()
        await parts.wait_status(keep.id, "fired", "cancelled")
        await parts.wait_status(move.id, "fired")
        return cancelled, moved

    stop = asyncio.Event()
    runner = asyncio.create_task(firing.run(parts.epoch, stop))
    try:
        async with asyncio.timeout(20):
            cancelled, moved = await answers()
    finally:
        stop.set()
        firing.wake.set()
        await asyncio.wait_for(runner, 10)
    assert (cancelled, moved) == ("in_flight", "in_flight")
    msgs = await _read(nats_url)
    assert ids_of(msgs) == {keep.id: 1, move.id: 1}
    assert parts.metrics.publish_in_doubt._value.get() >= 2


async def _read(nats_url: str) -> list[Any]:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        count = (await js.stream_info(STREAM)).state.messages
        psub = await js.pull_subscribe(">", stream=STREAM)
        try:
            return list(await psub.fetch(count, timeout=2)) if count else []
        finally:
            await psub.unsubscribe()
    finally:
        await nc.close()


class Spy:
    """Records what each claim, reclaim or payload fetch brought into memory."""

    def __init__(self, parts: Parts) -> None:
        self.calls: dict[str, list[tuple[int, int]]] = {}  # name -> (tasks, payload bytes)
        for name in ("claim_within", "reclaim_orphans", "load_claimed"):
            setattr(parts.tasks, name, self._wrap(name, getattr(parts.tasks, name)))

    def _wrap(self, name: str, method: Any) -> Any:
        async def spied(*args: Any, **kwargs: Any) -> Any:
            got = await method(*args, **kwargs)
            tasks = [*got.ready, *got.parked]
            self.calls.setdefault(name, []).append((len(tasks), sum(len(t.payload) for t in tasks)))
            return got

        return spied


async def test_a_burst_of_large_tasks_is_armed_within_the_byte_and_count_limits(
    settings: Settings,
) -> None:
    """200 tasks of 20 KB due at one instant, armed set limited to 64 tasks and 200 KB: no
    statement brings more than the budget (plus one task) into memory, the armed set never
    holds more than its limits, and every task goes out once, none early, in intake order."""
    async with parts_of(settings, armed_max=64, armed_max_bytes=200_000) as parts:
        spy = Spy(parts)
        rows = await parts.insert([soon(800)] * 200, heap=True, size=20_000)
        firing = parts.firing()
        peak = [0, 0]
        add = firing.armed.add

        def watched_add(tasks: Iterable[ClaimedTask]) -> int:
            # on the armed set itself: every path that arms a task goes through `Armed.add`
            added = add(tasks)
            peak[0] = max(peak[0], len(firing.armed))
            peak[1] = max(peak[1], firing.armed.bytes)
            return added

        firing.armed.add = watched_add  # type: ignore[method-assign]
        await run_for(firing, parts.epoch, parts.until_stored(len(rows)), within=30)
        msgs = await parts.stored(count=len(rows))
        assert [m.headers["Nats-Msg-Id"] for m in msgs] == [t.id for t in rows]
        assert early(msgs, {t.id: t.due_at for t in rows}) == []
        assert 0 < peak[0] <= 64 and peak[1] <= 200_000 + 20_000, peak
        fetched = [b for calls in spy.calls.values() for _, b in calls]
        assert fetched and max(fetched) <= 200_000 + 20_000 + 1_000, spy.calls
        assert "load_claimed" in spy.calls  # parked tasks were fetched later


async def test_orphans_of_an_earlier_leader_are_reclaimed_page_by_page(
    settings: Settings,
) -> None:
    """3,000 tasks claimed by an earlier leader that died before publishing them: the new
    leader takes them over in pages no larger than its armed set (500), never in one query,
    and publishes each once."""
    async with parts_of(settings, armed_max=500) as parts:
        rows = await parts.insert([soon(-1000)] * 3000)
        await parts.pool.execute(
            "UPDATE delayed_messages SET claimed_epoch = $1, claimed_at = now(), attempts = 1",
            parts.epoch,
        )
        parts.epoch = await take_office(parts.pool, "next-leader")
        parts.office = FixedOffice(parts.epoch)
        spy = Spy(parts)
        firing = parts.firing()
        firing.reclaim_orphans()
        await run_for(firing, parts.epoch, parts.until_stored(len(rows)), within=60)
        msgs = await parts.stored(count=len(rows))
        assert ids_of(msgs) == dict.fromkeys((t.id for t in rows), 1)
        pages = [n for n, _ in spy.calls["reclaim_orphans"]]
        assert sum(pages) == len(rows)
        assert len(pages) >= 6 and max(pages) <= 500, pages


async def test_cancel_and_reschedule_answer_by_what_may_have_been_delivered(parts: Parts) -> None:
    """Pending: `cancelled` / `rescheduled`. In doubt, or claimed again for its republish:
    `in_flight` (it may be in the stream already). Claimed once and not in doubt: `too_late`.
    Unknown: `not_found`. Only the pending ones change."""
    rows = await parts.insert([soon(60_000)] * 5)
    states = [
        ("pending", False),
        ("in_doubt", True),
        ("claimed", True),
        ("claimed", False),
    ]
    for t, (status, doubted) in zip(rows, states, strict=False):
        await parts.pool.execute(  # a claimed task keeps its ready status (migration 0013)
            "UPDATE delayed_messages SET status = CASE WHEN $2 <> 'claimed' THEN $2 WHEN $3 "
            "THEN 'in_doubt' ELSE 'pending' END, doubted = $3, claimed_epoch = CASE WHEN "
            "$2 = 'claimed' THEN $4::bigint END WHERE id = $1",
            t.id,
            status,
            doubted,
            parts.epoch,
        )
    cancels = [await parts.tasks.cancel(t.id, t.target) for t in rows[:4]]
    assert cancels == ["cancelled", "in_flight", "in_flight", "too_late"]
    moves = [(await parts.tasks.reschedule(t.id, t.target, soon(1000)))[0] for t in rows[1:]]
    assert moves == ["in_flight", "in_flight", "too_late", "rescheduled"]
    assert await parts.tasks.cancel("nope", rows[0].target) == "cancelled"
    assert await parts.status("nope") == "intent"
    assert [await parts.status(t.id) for t in rows] == [
        "cancelled",
        "in_doubt",
        "claimed",
        "claimed",
        "pending",
    ]
