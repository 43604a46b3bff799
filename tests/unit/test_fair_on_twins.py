"""Per-org quotas and fair firing: the pure heaps, and the delayed engine on the in-memory
twins with a fake clock (no server)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta

import pytest

from scheduler.bus.memory import MemoryWriter
from scheduler.clock import FakeClock, to_rfc3339
from scheduler.engine.delayed.armed import Armed
from scheduler.engine.delayed.claims import CLAIMS_IN_FLIGHT, Claimer
from scheduler.engine.delayed.fairness import (
    CONTENDED_WINDOW_MS,
    FAIR_ALLOWANCE,
    FAIR_BOOK_DEFER,
    FAIR_BUSY_LOOKAHEAD_MS,
    FAIR_CHUNK,
    FAIR_CLAIM,
    FAIR_INFLIGHT,
    FAIR_INFLIGHT_BYTES,
    FairArmed,
    FairHeap,
    Throttles,
)
from scheduler.engine.delayed.horizon import Horizon, HorizonHeap
from scheduler.engine.delayed.quota import OrgLabels
from scheduler.metrics import Metrics
from scheduler.operations.tasks import TaskOperations
from scheduler.records import Claimed, ClaimedTask, TaskRef, from_ms, to_ms
from scheduler.settings import Settings
from tests.unit.engine_twins import T0, Delivery, Engine, engine_on_twins

T0_MS = int(T0.timestamp() * 1000)


def ref(n: int, org: str | None, due: int = 100, priority: int = 5) -> TaskRef:
    return TaskRef(f"{org}-{n}", due, priority, n, org)


def heap_of(refs: list[TaskRef], shares: dict[str, int] | None = None) -> FairHeap:
    heap = FairHeap(shares)
    heap.loaded(refs, complete_until_ms=10_000)
    return heap


def test_take_due_takes_turns_by_org_weighted_by_share() -> None:
    """Tasks due together are taken round-robin by org, `share` at a time, each org's own in
    firing order; orgs without a share weigh 1."""
    refs = [ref(i, "acme") for i in range(6)] + [ref(100 + i, "beta") for i in range(3)]
    heap = heap_of(refs, {"acme": 3})
    got = [e[3] for e in heap.pop_due(200, 100)]
    assert got == [
        *("acme-0", "acme-1", "acme-2"),
        "beta-100",
        *("acme-3", "acme-4", "acme-5"),
        "beta-101",
        "beta-102",
    ]
    assert len(heap) == 0 and heap.next_due_ms() is None


def test_a_later_due_task_of_another_org_is_not_stuck_behind_a_late_backlog() -> None:
    """Org B's task due at 150 is taken in the first claim at 150 even though 10,000 tasks of
    org A due at 100 are still waiting; the FIFO heap would take it after all of them."""
    refs = [ref(i, "a", due=100) for i in range(10_000)] + [ref(1, "b", due=150)]
    fair = heap_of(refs)
    first = [e[3] for e in fair.pop_due(150, 50)]
    assert "b-1" in first[:2] and len(first) == 50
    assert len(fair) == 10_000 - 49
    fifo = HorizonHeap()
    fifo.loaded(refs, complete_until_ms=10_000)
    assert "b-1" not in [e[3] for e in fifo.pop_due(150, 50)]


def test_an_org_with_nothing_due_blocks_nobody_and_keeps_its_place() -> None:
    """An org whose first task is not yet due gives nothing and holds up no one; its task
    comes out when due, and next_due follows the earliest org."""
    heap = heap_of([ref(1, "a", due=100), ref(2, "a", due=101), ref(1, "c", due=500)])
    assert heap.next_due_ms() == 100
    assert [e[3] for e in heap.pop_due(200, 10)] == ["a-1", "a-2"]
    assert heap.next_due_ms() == 500
    heap.push(ref(3, None, due=300))  # no org: the unnamed group
    assert [e[3] for e in heap.pop_due(400, 10)] == ["None-3"]
    assert [e[3] for e in heap.pop_due(500, 10)] == ["c-1"]
    heap.reset()
    assert len(heap) == 0 and heap.next_due_ms() is None


def claimed(n: int, org: str, due_ms: int) -> ClaimedTask:
    at = from_ms(due_ms)
    return ClaimedTask(f"{org}-{n}", "mq.x", b"p", {}, 5, at, at, None, 1, n, org_id=org)


def test_armed_hands_out_a_backlog_in_fair_chunks() -> None:
    """With more due than one chunk, the armed set hands out a chunk taking turns by org, and
    keeps the rest in firing order; a task armed meanwhile waits behind one chunk at most."""
    armed = FairArmed(100_000, 10**9, chunk=100)
    armed.add([claimed(i, "a", T0_MS) for i in range(1_000)])
    armed.add([claimed(1, "b", T0_MS + 5)])
    first = armed.pop_due(T0_MS + 10)
    assert len(first) == 100 and first[1][4].id == "b-1"
    armed.add([claimed(2, "b", T0_MS + 20)])
    second = armed.pop_due(T0_MS + 30)
    assert second[1][4].id == "b-2" and len(armed) == 1_001 - 100 + 1 - 100
    rest = [s[4].id for s in armed.pop_due(T0_MS + 30)]
    assert rest == sorted(rest, key=lambda i: int(i[2:]))  # still in firing order
    fifo = Armed(100_000, 10**9)
    fifo.add([claimed(i, "a", T0_MS) for i in range(1_000)] + [claimed(1, "b", T0_MS + 5)])
    assert fifo.pop_due(T0_MS + 10)[-1][4].id == "b-1"  # behind all of a's


def test_metric_labels_are_bounded() -> None:
    """Named orgs and the first `limit` others keep their label; the rest are `other`."""
    labels = OrgLabels(["acme"], 2)
    assert [labels(o) for o in ["x", "acme", "y", "z", "x"]] == ["x", "acme", "y", "other", "x"]


def test_org_shares_setting_is_parsed_and_checked() -> None:
    """`acme=3,beta=1` gives weights; a malformed part names itself and the problem."""
    assert Settings(org_shares="acme=3, beta=1").org_shares == {"acme": 3, "beta": 1}
    with pytest.raises(ValueError, match="'acme:3' is not org=weight"):
        Settings(org_shares="acme:3")
    with pytest.raises(ValueError, match="between 1 and 1000"):
        Settings(org_shares="acme=0")


# --- the engine on the twins ---------------------------------------------------------------

_counter = 0


def send(e: Engine, org: str | None, delay_ms: int, target: str = "inference.chat") -> str:
    """A producer's envelope of `org` on the lane, due `delay_ms` after the fake clock's now."""
    global _counter
    _counter += 1
    task_id = f"{org}_{_counter:05d}"
    doc = {
        "schema": "hanzo.mq.v1",
        "id": task_id,
        "type": "t",
        "source": "test",
        "timestamp": to_rfc3339(e.clock.now()),
        "delay_until": to_rfc3339(e.clock.now() + timedelta(milliseconds=delay_ms)),
        "data": {},
    }
    if org is not None:
        doc["org_id"] = org
    e.lane.queue.put_nowait(
        Delivery(f"mq.delay.{target}", json.dumps(doc).encode(), f"ack.{task_id}")
    )
    return task_id


@pytest.fixture
async def quota() -> AsyncIterator[Engine]:
    e = await engine_on_twins(org_max_pending=3)
    await e.start()
    yield e
    await e.close()


async def test_a_task_over_its_orgs_quota_is_dead_lettered_and_nothing_else_lost(
    quota: Engine,
) -> None:
    """With a quota of 3, acme's 4th and 5th pending tasks are refused as quota_exceeded
    (termed, dead-lettered with the org named); acme's first 3 and beta's task are stored and
    delivered, and every message is settled."""
    acme = [send(quota, "acme", 500) for _ in range(5)]
    beta = send(quota, "beta", 500)
    await quota.until(lambda: len(quota.store.dead_letters) == 2)
    assert [d["reason"] for d in quota.store.dead_letters] == ["quota_exceeded"] * 2
    assert "organisation 'acme'" in quota.store.dead_letters[0]["error"]
    assert {*quota.store.rows, *quota.store.fired} == {*acme[:3], beta}
    dlq = quota.streams.messages("DLQ")
    assert len(dlq) == 2 and dlq[0].headers["Mq-Error-Reason"] == "quota_exceeded"
    ledger = quota.engine.ledger
    assert ledger is not None and ledger.counts == {"acme": 3, "beta": 1}
    await quota.until(lambda: len(quota.delivered()) == 4)
    assert sorted(quota.ids()) == sorted([*acme[:3], beta])
    metrics = quota.metrics
    assert metrics.quota_refused.labels("acme")._value.get() == 2


async def test_the_count_falls_as_tasks_fire_and_after_a_cancel_at_the_next_count(
    quota: Engine,
) -> None:
    """Fired tasks leave the count at once, so the org may schedule again; a cancel made
    through the store (the API, maybe on another instance) leaves it at the next count."""
    first = [send(quota, "acme", 50) for _ in range(3)]
    await quota.until(lambda: len(quota.delivered()) == 3)
    await quota.until(lambda: all(quota.store.status(i) == "fired" for i in first))
    ledger = quota.engine.ledger
    assert ledger is not None and ledger.counts == {}
    later = [send(quota, "acme", 60_000) for _ in range(3)]
    await quota.until(lambda: all(i in quota.store.rows for i in later))
    assert ledger.counts == {"acme": 3}
    assert await quota.store.cancel(later[0], "mq.inference.chat") == "cancelled"
    refused = send(quota, "acme", 60_000)
    await quota.until(lambda: len(quota.store.dead_letters) == 1)
    assert refused not in quota.store.rows
    assert ledger.counts == {"acme": 3}
    # the loader's periodic count (every COUNT_EVERY seconds; its wait is on real time)
    ledger.reset(await quota.store.pending_by_org())
    assert ledger.counts == {"acme": 2}
    again = send(quota, "acme", 60_000)
    await quota.until(lambda: again in quota.store.rows)
    assert ledger.counts == {"acme": 3} and len(quota.store.dead_letters) == 1


async def test_quotas_off_refuse_nothing() -> None:
    """Without SCHEDULER_ORG_MAX_PENDING there is no ledger and no refusal."""
    e = await engine_on_twins()
    await e.start()
    try:
        ids = [send(e, "acme", 100) for _ in range(20)]
        await e.until(lambda: len(e.delivered()) == 20)
        assert sorted(e.ids()) == sorted(ids) and e.engine.ledger is None
    finally:
        await e.close()


async def flood(fair: bool) -> list[str]:
    """Org a floods 2,000 tasks due at one instant, then org b sends 5 due 1 ms later."""
    e = await engine_on_twins(fair_firing=fair, batch=100, armed_max=300)
    await e.start()
    try:
        for _ in range(2_000):
            send(e, "a", 200)
        b = [send(e, "b", 201) for _ in range(5)]
        await e.until(lambda: all(i in e.store.rows for i in b))
        await e.until(lambda: len(e.delivered()) == 2_005, limit_ms=30_000)
        return e.ids()
    finally:
        await e.close()


async def test_fair_firing_delivers_a_small_org_among_the_first_while_a_flood_drains() -> None:
    """While 2,000 tasks of org a due at one instant drain, org b's 5 tasks due just after go
    out among the first few hundred with fair firing, and after all of a's in FIFO."""
    fair = await flood(True)
    b_fair = [i for i, t in enumerate(fair) if t.startswith("b_")]
    assert len(b_fair) == 5 and max(b_fair) < 400, b_fair
    fifo = await flood(False)
    b_fifo = [i for i, t in enumerate(fifo) if t.startswith("b_")]
    assert b_fifo == [2_000, 2_001, 2_002, 2_003, 2_004]
    a_fair = [t for t in fair if t.startswith("a_")]
    assert a_fair == sorted(a_fair)  # each org's own tasks keep their firing order


def test_fair_firing_off_restores_every_fifo_part() -> None:
    """`fair_firing=false` gives the plain heap and armed set, and throttles that never
    engage: whole claims of `batch`, the usual lookahead and bookkeeping, no in-flight cap of
    the dispatcher's own, even with two orgs due."""
    from scheduler.engine.delayed import fairness as fair

    off, on = Settings(batch=800), Settings(fair_firing=True, batch=800)
    assert not off.fair_firing  # the default
    assert type(fair.horizon_heap(off)) is HorizonHeap and type(fair.armed_set(off)) is Armed
    assert isinstance(fair.horizon_heap(on), FairHeap) and isinstance(fair.armed_set(on), FairArmed)
    heap = fair.horizon_heap(off)
    heap.loaded([ref(1, "a"), ref(1, "b")], complete_until_ms=10_000)
    throttles = fair.Throttles(off, heap, fair.armed_set(off))
    assert throttles.update(100) is False
    assert_fifo_limits(throttles)


def assert_fifo_limits(throttles: Throttles) -> None:
    assert (throttles.claim_limit, throttles.busy_lookahead(80)) == (800, 80)
    assert throttles.book_defer_max(50_000) == 50_000
    assert throttles.inflight_cap >= 2**62 and throttles.inflight_bytes_cap >= 2**62


def fair_parts() -> tuple[FairHeap, FairArmed, Throttles]:
    settings = Settings(fair_firing=True, batch=800)
    heap, armed = FairHeap(), FairArmed(100_000, 10**9)
    return heap, armed, Throttles(settings, heap, armed)


def test_one_org_due_runs_on_the_fifo_limits() -> None:
    """With fair firing on and a single org's burst due (others far off), nothing is
    throttled: FIFO's claim size, lookahead, bookkeeping and in-flight window, and the armed
    set hands out everything due at once, in firing order."""
    heap, armed, throttles = fair_parts()
    far = T0_MS + CONTENDED_WINDOW_MS + 1
    heap.loaded(
        [ref(i, "a", due=T0_MS) for i in range(2_000)] + [ref(1, "b", due=far)],
        complete_until_ms=far + 10_000,
    )
    armed.add([claimed(i, "a", T0_MS) for i in range(1_000)])
    assert throttles.update(T0_MS - 1) is False
    assert_fifo_limits(throttles)
    out = armed.pop_due(T0_MS)
    assert [s[4].id for s in out] == [f"a-{i}" for i in range(1_000)] and not armed


def test_two_orgs_due_within_the_window_engage_the_fair_limits() -> None:
    """A second org's task due within the window (in the heap) or armed makes the throttles
    fair: small claims, the in-flight caps, the longer busy lookahead, chunks taking turns;
    once it is gone they fall back to the FIFO ones."""
    heap, armed, throttles = fair_parts()
    heap.loaded(
        [ref(i, "a", due=T0_MS) for i in range(2_000)]
        + [ref(1, "b", due=T0_MS + CONTENDED_WINDOW_MS - 10)],
        complete_until_ms=T0_MS + 10_000,
    )
    assert throttles.update(T0_MS) is True
    assert throttles.claim_limit == FAIR_CLAIM < 800
    assert throttles.busy_lookahead(80) == FAIR_BUSY_LOOKAHEAD_MS > 80
    assert throttles.book_defer_max(50_000) == FAIR_BOOK_DEFER < 50_000
    assert (throttles.inflight_cap, throttles.inflight_bytes_cap) == (
        FAIR_INFLIGHT,
        FAIR_INFLIGHT_BYTES,
    )
    taken = heap.pop_due(T0_MS + CONTENDED_WINDOW_MS, 2)
    assert [e[3] for e in taken] == ["a-0", "b-1"]  # b's is off the heap (armed instead)
    assert throttles.update(T0_MS + 1) is False
    armed.add([claimed(i, "a", T0_MS) for i in range(1_000)] + [claimed(1, "b", T0_MS + 5)])
    assert throttles.update(T0_MS + 2) is True
    out = armed.pop_due(T0_MS + 10)
    assert len(out) == FAIR_CHUNK and out[1][4].id == "b-1"  # round robin within a chunk
    armed.pop_due(T0_MS + 10)
    assert throttles.update(T0_MS + 3) is False  # b's task went out: a drains on FIFO's
    assert_fifo_limits(throttles)


def test_an_org_with_little_in_flight_may_send_while_the_caps_are_reached() -> None:
    """While the in-flight caps are reached, an armed org with fewer than FAIR_ALLOWANCE
    publishes unacknowledged may still hand over that many due tasks; the flooding org,
    with hundreds in flight, gives nothing until acks come back."""
    _, armed, throttles = fair_parts()
    armed.add([claimed(i, "a", T0_MS) for i in range(1_000)])
    armed.add([claimed(i, "b", T0_MS + 5 + i) for i in range(30)])
    allow = throttles.allowance(armed, {"a": FAIR_INFLIGHT, "b": 2})
    assert allow == {"b": FAIR_ALLOWANCE - 2}
    assert armed.next_due_ms(allow) == T0_MS + 5
    out = armed.pop_due(T0_MS + 100, allow)
    assert [s[4].id for s in out] == [f"b-{i}" for i in range(FAIR_ALLOWANCE - 2)]
    assert armed.pop_due(T0_MS + 100, {}) == [] and len(armed) == 1_000 + 30 - len(out)


def test_orgs_due_by_counts_distinct_current_orgs_only() -> None:
    """The count sees each org once, ignores index entries made stale by an earlier first
    task, counts the orgs given as known, and stops at `enough`."""
    heap = FairHeap()
    heap.push(ref(1, "a", due=500))
    heap.push(ref(2, "a", due=100))  # a's first task is now due at 100; the 500 entry is stale
    heap.push(ref(1, "b", due=400))
    assert heap.orgs_due_by(99) == 0
    assert heap.orgs_due_by(300) == 1
    assert heap.orgs_due_by(300, ["b"]) == 2
    assert heap.orgs_due_by(400) == 2
    heap.push(ref(1, "c", due=10))
    assert heap.orgs_due_by(1_000, enough=5) == 3


async def test_overlapping_claims_share_the_byte_room() -> None:
    """Claims in flight together each may bring a quarter of the armed set's free byte room,
    so the later claims of a burst come back with their payloads, not parked behind the
    first one's reservation of all of it."""
    budgets: list[int] = []
    release = asyncio.Event()

    class Repo:
        async def claim_within(
            self, epoch: int, ids: Sequence[str], until: datetime, budget: int
        ) -> Claimed:
            budgets.append(budget)
            await release.wait()
            return Claimed([], [])

    horizon = Horizon(HorizonHeap())
    refs = [ref(i, None, due=T0_MS) for i in range(4_000)]
    horizon.heap.loaded(refs, complete_until_ms=T0_MS + 10_000)
    armed = Armed(100_000, 4_000_000)
    claimer = Claimer(
        settings=Settings(batch=1_000),
        horizon=horizon,
        tasks=Repo(),  # type: ignore[arg-type]
        armed=armed,
        clock=FakeClock(T0),
        events=Metrics(),
        arm=lambda _: None,
        on_fenced=lambda _: None,
    )
    for _ in range(CLAIMS_IN_FLIGHT):
        assert await claimer.claim_due(1)
    await asyncio.sleep(0)
    assert budgets == [1_000_000] * CLAIMS_IN_FLIGHT
    release.set()
    await claimer.settle()


async def test_a_rescheduled_task_waits_in_its_own_orgs_queue() -> None:
    """With fair firing, a task moved by a reschedule (the API's path: store, then the notice
    to the leader) re-enters the heap under its organisation: acme's two tasks now due
    together count as one organisation, not acme plus the no-organisation queue."""
    e = await engine_on_twins(fair_firing=True)
    writer = MemoryWriter(e.streams, e.bus)  # the notice reaches the twin bus's listeners
    ops = TaskOperations(writer, e.engine.settings, e.store, None, e.clock)  # type: ignore[arg-type]
    await e.start()
    try:
        due = e.clock.now() + timedelta(seconds=120)
        stays, moved = send(e, "acme", 120_000), send(e, "acme", 200_000)
        await e.until(lambda: len(e.engine.horizon) == 2)
        outcome = await ops.reschedule(moved, due, "mq.inference.chat")
        assert outcome.status == "rescheduled"
        await e.settle()
        heap = e.engine.horizon.heap
        assert isinstance(heap, FairHeap) and len(heap) == 3  # the old entry is skipped later
        assert heap.orgs_due_by(to_ms(due), enough=3) == 1
        await e.until(
            lambda: sorted(e.ids()) == sorted([stays, moved]), step_ms=1_000, limit_ms=200_000
        )
    finally:
        await e.close()
