"""The bounded horizon on the in-memory twins with a fake clock: many more tasks due at one
instant than the heap may hold, through intake while the leader runs and in the store when a
leader takes office; every task fires once, in firing order, never early, and the heap never
holds more than its bound."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta

import pytest

from scheduler.clock import to_rfc3339
from scheduler.engine.delayed import rescheduled
from scheduler.records import Claimed, NewTask, to_ms
from tests.support.stores import insert
from tests.unit.engine_twins import T0, Engine, engine_on_twins

BOUND = 20
POLICIES = pytest.mark.parametrize("catchup", ["due_order", "on_time_first"])


def watch(twin: Engine, seen: list[int]) -> bool:
    """Record the heap's size at every step the test takes (through its `until` checks)."""
    seen.append(len(twin.engine.horizon))
    return True


def once_in_order(twin: Engine, expected: list[str]) -> None:
    ids = twin.ids()
    assert not [i for i, n in Counter(ids).items() if n > 1], "delivered twice"
    assert ids == expected


def not_early(twin: Engine, due_ms: dict[str, int]) -> None:
    for msg in twin.delivered():
        task_id = msg.headers["Nats-Msg-Id"]
        if task_id in due_ms:
            fired = msg.headers["Mq-Fired-At"]
            assert fired >= to_rfc3339(T0 + timedelta(milliseconds=due_ms[task_id]))


@POLICIES
async def test_a_dense_instant_through_intake_fires_once_in_order_within_the_bound(
    catchup: str,
) -> None:
    """300 tasks due at one instant arrive on the lane while the leader runs, with the heap
    bounded to 20: the heap gives up its tail and reads it back from the store in order, so
    all 300 fire once, in intake order, none early, the heap never over 20."""
    twin = await engine_on_twins(horizon_max_tasks=BOUND, catchup=catchup)
    await twin.start()
    sizes: list[int] = []
    try:
        start = to_ms(twin.clock.now()) - to_ms(T0)
        ids = [twin.send(delay_ms=500 - start) for _ in range(300)]
        await twin.until(lambda: watch(twin, sizes) and len(twin.ids()) >= 300, limit_ms=5_000)
        await twin.settle()
    finally:
        await twin.close()
    once_in_order(twin, ids)
    assert max(sizes) <= BOUND and twin.engine.horizon.heap.evicted > 0
    assert all(twin.store.status(i) == "fired" for i in ids)


@POLICIES
async def test_tasks_arriving_latest_first_still_fire_in_due_order(catchup: str) -> None:
    """Tasks sent latest-due first each land ahead of the heap's tail (so the full heap trims
    again and again); they still fire once each at their own millisecond, in due order."""
    twin = await engine_on_twins(horizon_max_tasks=BOUND, catchup=catchup)
    await twin.start()
    sizes: list[int] = []
    try:
        start = to_ms(twin.clock.now()) - to_ms(T0)
        due = {
            twin.send(delay_ms=1_000 + 3 * (100 - k)): start + 1_000 + 3 * (100 - k)
            for k in range(100)
        }
        await twin.until(lambda: watch(twin, sizes) and len(twin.ids()) >= 100, limit_ms=5_000)
        await twin.settle()
    finally:
        await twin.close()
    once_in_order(twin, sorted(due, key=lambda i: due[i]))
    not_early(twin, due)
    assert max(sizes) <= BOUND and twin.engine.horizon.heap.evicted > 0


@POLICIES
async def test_a_new_leader_over_an_overdue_backlog_drains_it_within_the_bound(
    catchup: str,
) -> None:
    """300 overdue tasks wait in the store when a leader takes office with the heap bounded
    to 20: paged in as the claimer drains, all fire once, in firing order."""
    twin = await engine_on_twins(horizon_max_tasks=BOUND, catchup=catchup)
    now = twin.clock.now()
    rows = []
    for k in range(300):
        task_id = f"old_{k:04d}"
        doc = {"id": task_id, "n": k}
        due = now - timedelta(seconds=60) + timedelta(milliseconds=k % 7)
        rows.append(
            NewTask(
                task_id,
                "mq.inference.chat",
                json.dumps(doc).encode(),
                {},
                1 + k % 3,
                due,
                due,
                None,
            )
        )
    refs = await insert(twin.store, rows)
    await twin.start()
    sizes: list[int] = []
    try:
        await twin.until(lambda: watch(twin, sizes) and len(twin.ids()) >= 300, limit_ms=5_000)
        await twin.settle()
    finally:
        await twin.close()
    once_in_order(twin, [r.task_id for r in sorted(refs, key=lambda r: r.key)])
    assert max(sizes) <= BOUND


@POLICIES
async def test_a_reschedule_notice_and_a_retry_into_a_full_heap_are_not_lost(catchup: str) -> None:
    """With the heap full of a dense instant, a task rescheduled to before it (its notice)
    and a task whose publish failed (its retry) still fire once each, and so does the rest."""
    from scheduler.records import PublishError

    twin = await engine_on_twins(horizon_max_tasks=BOUND, backoff="50ms", catchup=catchup)
    await twin.start()
    broker = twin.bus.publishers[0]
    try:
        start = to_ms(twin.clock.now()) - to_ms(T0)
        dense = [twin.send(delay_ms=800 - start) for _ in range(100)]
        moved = twin.send(delay_ms=60_000)
        await twin.until(lambda: moved in twin.store.rows)
        answer, ref = await twin.store.reschedule(
            moved, "mq.inference.chat", T0 + timedelta(milliseconds=700)
        )
        assert answer == "rescheduled" and ref is not None
        await twin.bus.notify(rescheduled.SUBJECT, rescheduled.encode(ref))
        failures = iter([PublishError("mq.inference.chat", "no responders", in_doubt=False)])
        broker.fail = lambda subject: next(failures, None)
        await twin.until(lambda: len(set(twin.ids())) >= 101, limit_ms=5_000)
        await twin.settle()
    finally:
        await twin.close()
    ids = twin.ids()
    assert Counter(ids)[moved] == 1 and ids[0] == moved
    assert sorted(ids) == sorted([moved, *dense]) and len(ids) == 101
    assert [i for i in ids if twin.store.fired[i].attempts == 2] != []  # the retry happened


async def _catch_up(catchup: str, backlog: int = 3_000) -> tuple[dict[str, int], Engine]:
    """A leader takes office over `backlog` tasks overdue by a minute (each claim a 5 ms
    round trip of fake time) while 20 tasks arrive on the lane, the first due 10 ms after
    it and each next 5 ms after the last: each present task's lateness (fake ms), and
    `drained_ms`, when the last task went out."""
    twin = await engine_on_twins(horizon_max_tasks=1_000, batch=50, catchup=catchup)
    now = twin.clock.now()
    rows = [
        NewTask(
            f"old_{k:05d}",
            "mq.inference.chat",
            json.dumps({"id": f"old_{k:05d}"}).encode(),
            {},
            5,
            now - timedelta(seconds=60),
            now - timedelta(seconds=60),
            None,
        )
        for k in range(backlog)
    ]
    await insert(twin.store, rows)
    claim = twin.store.claim_within

    async def slow_claim(  # a claim's round trip: 5 ms of fake time
        epoch: int, ids: Sequence[str], until: datetime, budget: int
    ) -> Claimed:
        await twin.clock.sleep(0.005)
        return await claim(epoch, ids, until, budget)

    twin.store.claim_within = slow_claim  # type: ignore[method-assign]
    await twin.start()
    start = to_ms(twin.clock.now()) - to_ms(T0)
    due = {twin.send(delay_ms=10 + 5 * k): start + 10 + 5 * k for k in range(20)}
    late: dict[str, int] = {}
    progress: dict[bool, int] = {}

    def seen() -> bool:
        at = to_ms(twin.clock.now()) - to_ms(T0)
        progress.setdefault(len(twin.ids()) >= backlog + 20, at)
        for task_id in twin.ids()[-200:]:
            if task_id in due:
                late.setdefault(task_id, at - due[task_id])
        return len(twin.ids()) >= backlog + 20

    try:
        await twin.until(seen, limit_ms=20_000)
        await twin.settle()
    finally:
        await twin.close()
    ids = twin.ids()
    assert len(ids) == len(set(ids)) == backlog + 20  # every task once
    not_early(twin, due)
    late["drained_ms"] = progress[True] - start
    return late, twin


async def test_on_time_first_serves_the_present_while_a_backlog_drains() -> None:
    """With SCHEDULER_CATCHUP=on_time_first, tasks falling due while a leader drains 3,000
    overdue ones go out about on time; in due order (the default) they wait behind the
    backlog. Either way every task fires once, none early, the backlog in firing order."""
    fifo, _ = await _catch_up("due_order")
    fair, fair_twin = await _catch_up("on_time_first")
    backlog_order = [i for i in fair_twin.ids() if i.startswith("old_")]
    assert backlog_order == sorted(backlog_order)
    fifo_drained, fair_drained = fifo.pop("drained_ms"), fair.pop("drained_ms")
    assert max(fair.values()) <= 10, fair  # a claim's round trip, not the backlog
    assert max(fifo.values()) > 5 * max(fair.values(), default=1) + 20, (fifo, fair)
    assert fair_drained <= 1.5 * fifo_drained  # the backlog still drains at about its pace
    print(  # the figures, with -s
        f"present lateness (fake ms) while 3,000 overdue drain: due_order max "
        f"{max(fifo.values())}, on_time_first max {max(fair.values())}; all out after "
        f"{fifo_drained} / {fair_drained} ms"
    )
