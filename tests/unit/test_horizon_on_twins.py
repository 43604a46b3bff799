"""The bounded horizon on the in-memory twins with a fake clock: many more tasks due at one
instant than the heap may hold, through intake while the leader runs and in the store when a
leader takes office; every task fires once, in firing order, never early, and the heap never
holds more than its bound."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta

from scheduler.clock import to_rfc3339
from scheduler.engine.delayed import rescheduled
from scheduler.records import NewTask, to_ms
from tests.unit.engine_twins import T0, Engine, engine_on_twins

BOUND = 20


def watch(twin: Engine, seen: list[int]) -> None:
    """Record the heap's size at every step the test takes (through its `until` checks)."""
    seen.append(len(twin.engine.horizon))


def once_in_order(twin: Engine, expected: list[str]) -> None:
    ids = twin.ids()
    assert not [i for i, n in Counter(ids).items() if n > 1], "delivered twice"
    assert ids == expected


def not_early(twin: Engine, due_ms: dict[str, int]) -> None:
    for msg in twin.delivered():
        fired = msg.headers["Mq-Fired-At"]
        assert fired >= to_rfc3339(T0 + timedelta(milliseconds=due_ms[msg.headers["Nats-Msg-Id"]]))


async def test_a_dense_instant_through_intake_fires_once_in_order_within_the_bound() -> None:
    """300 tasks due at one instant arrive on the lane while the leader runs, with the heap
    bounded to 20: the heap gives up its tail and reads it back from the store in order, so
    all 300 fire once, in intake order, none early, the heap never over 20."""
    twin = await engine_on_twins(horizon_max_tasks=BOUND)
    await twin.start()
    sizes: list[int] = []
    try:
        start = to_ms(twin.clock.now()) - to_ms(T0)
        ids = [twin.send(delay_ms=500 - start) for _ in range(300)]
        await twin.until(lambda: (watch(twin, sizes), len(twin.ids()) >= 300)[1], limit_ms=5_000)
        await twin.settle()
    finally:
        await twin.close()
    once_in_order(twin, ids)
    assert max(sizes) <= BOUND and twin.engine.horizon.heap.evicted > 0
    assert all(twin.store.status(i) == "fired" for i in ids)


async def test_tasks_arriving_latest_first_still_fire_in_due_order() -> None:
    """Tasks sent latest-due first each land ahead of the heap's tail (so the full heap trims
    again and again); they still fire once each at their own millisecond, in due order."""
    twin = await engine_on_twins(horizon_max_tasks=BOUND)
    await twin.start()
    sizes: list[int] = []
    try:
        start = to_ms(twin.clock.now()) - to_ms(T0)
        due = {
            twin.send(delay_ms=1_000 + 3 * (100 - k)): start + 1_000 + 3 * (100 - k)
            for k in range(100)
        }
        await twin.until(lambda: (watch(twin, sizes), len(twin.ids()) >= 100)[1], limit_ms=5_000)
        await twin.settle()
    finally:
        await twin.close()
    once_in_order(twin, sorted(due, key=lambda i: due[i]))
    not_early(twin, due)
    assert max(sizes) <= BOUND and twin.engine.horizon.heap.evicted > 0


async def test_a_new_leader_over_an_overdue_backlog_drains_it_within_the_bound() -> None:
    """300 overdue tasks wait in the store when a leader takes office with the heap bounded
    to 20: paged in as the claimer drains, all fire once, in firing order."""
    twin = await engine_on_twins(horizon_max_tasks=BOUND)
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
    refs = await twin.store.insert(rows)
    await twin.start()
    sizes: list[int] = []
    try:
        await twin.until(lambda: (watch(twin, sizes), len(twin.ids()) >= 300)[1], limit_ms=5_000)
        await twin.settle()
    finally:
        await twin.close()
    once_in_order(twin, [r.task_id for r in sorted(refs, key=lambda r: r.key)])
    assert max(sizes) <= BOUND


async def test_a_reschedule_notice_and_a_retry_into_a_full_heap_are_not_lost() -> None:
    """With the heap full of a dense instant, a task rescheduled to before it (its notice)
    and a task whose publish failed (its retry) still fire once each, and so does the rest."""
    from scheduler.records import PublishError

    twin = await engine_on_twins(horizon_max_tasks=BOUND, backoff="50ms")
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
