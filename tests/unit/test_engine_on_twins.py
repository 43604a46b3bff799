"""The delayed engine on the in-memory twins with a fake clock: intake, firing order, races,
retries and a failover, each in fake milliseconds (no server)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from scheduler.engine.delayed import rescheduled
from scheduler.records import PublishError, to_ms
from tests.unit.engine_twins import T0, Delivery, Engine, engine_on_twins


@pytest.fixture
async def twin() -> AsyncIterator[Engine]:
    e = await engine_on_twins()
    await e.start()
    yield e
    await e.close()


async def test_intake_stores_acks_and_delivers_at_the_due_millisecond(twin: Engine) -> None:
    """A task on the lane is stored, acked, and delivered once at its due millisecond, never
    before, with the scheduler's headers."""
    task_id = twin.send(delay_ms=250)
    await twin.until(lambda: twin.store.status(task_id) is not None)
    assert twin.bus.publishers[0].acked == [f"ack.{task_id}"]
    waited = await twin.until(lambda: bool(twin.delivered()))
    (msg,) = twin.delivered()
    assert msg.subject == "mq.inference.chat"
    assert msg.headers["Nats-Msg-Id"] == task_id
    assert msg.headers["Mq-Attempt"] == "1"
    fired_at = to_ms(twin.clock.now())
    assert fired_at >= to_ms(T0) + 250 and waited <= 260
    await twin.until(lambda: twin.store.status(task_id) == "fired")


async def test_tasks_fire_in_due_then_priority_then_intake_order(twin: Engine) -> None:
    """Among tasks due together the higher priority goes first, then intake order; an
    earlier due time beats both."""
    a = twin.send(300, priority=5)
    b = twin.send(300, priority=1)
    c = twin.send(300, priority=5)
    d = twin.send(200, priority=9)
    await twin.until(lambda: len(twin.delivered()) == 4)
    assert twin.ids() == [d, b, a, c]


async def test_a_bad_envelope_is_refused_and_dead_lettered_not_stored(twin: Engine) -> None:
    """A message that is not a valid envelope is termed and dead-lettered; the lane goes on."""
    bad = Delivery("mq.delay.inference.chat", b"not json", "ack.bad")
    twin.lane.queue.put_nowait(bad)
    good = twin.send(10)
    await twin.until(lambda: twin.ids() == [good])
    assert bad.termed
    assert [d["reason"] for d in twin.store.dead_letters] == ["unparseable"]
    assert good in twin.store.rows and len(twin.store.rows) == 1
    (copy,) = twin.streams.messages("DLQ")
    assert copy.subject == "mq.dlq.inference.chat" and copy.payload == b"not json"


async def test_cancel_before_the_claim_wins_and_after_it_is_too_late(twin: Engine) -> None:
    """A cancel while the task is pending stops its delivery; once claimed (inside the
    lookahead) the cancel answers too_late and the task is delivered."""
    early, late = twin.send(500), twin.send(5_000)
    await twin.until(lambda: early in twin.store.rows and late in twin.store.rows)
    assert await twin.store.cancel(late, "mq.inference.chat") == "cancelled"
    await twin.until(lambda: twin.store.status(early) == "claimed", limit_ms=600)
    assert await twin.store.cancel(early, "mq.inference.chat") == "too_late"
    await twin.until(lambda: twin.ids() == [early])
    twin.clock.advance(6)
    await twin.settle()
    assert twin.ids() == [early]


async def test_a_reschedule_moves_the_delivery(twin: Engine) -> None:
    """A pending task rescheduled earlier fires at the new time once the notice arrives."""
    task_id = twin.send(60_000)
    await twin.until(lambda: task_id in twin.store.rows)
    new_due = twin.clock.now().replace(microsecond=0) + __import__("datetime").timedelta(seconds=2)
    answer, ref = await twin.store.reschedule(task_id, "mq.inference.chat", new_due)
    assert answer == "rescheduled" and ref is not None
    await twin.bus.notify(rescheduled.SUBJECT, rescheduled.encode(ref))
    await twin.until(lambda: twin.ids() == [task_id], step_ms=10)
    assert to_ms(twin.clock.now()) - to_ms(new_due) < 50


async def test_a_lost_ack_is_retried_with_the_same_id_and_stored_once(twin: Engine) -> None:
    """The first publish's ack is lost (the message was stored): the task goes in doubt, is
    republished after the backoff with the same Nats-Msg-Id, and the stream's duplicate window
    keeps one copy."""
    broker = twin.bus.publishers[0]
    failures = iter([PublishError("mq.inference.chat", "ack timed out", in_doubt=True)])
    broker.fail = lambda subject: next(failures, None)
    task_id = twin.send(10)
    await twin.until(lambda: twin.store.status(task_id) is not None)
    await twin.until(lambda: twin.store.status(task_id) == "in_doubt")
    assert await twin.store.cancel(task_id, "mq.inference.chat") == "in_flight"
    await twin.until(lambda: twin.store.status(task_id) == "fired", step_ms=50)
    assert twin.ids() == [task_id]
    assert task_id not in twin.store.rows and twin.store.fired[task_id].attempts == 2


async def test_a_failover_hands_claimed_tasks_to_the_next_leader() -> None:
    """A leader deposed after claiming (before publishing) publishes nothing more; the next
    leader, on the same store and streams, reclaims the task and delivers it once."""
    first = await engine_on_twins()
    await first.start()
    task_id = first.send(400)
    await first.until(lambda: first.store.status(task_id) is not None)
    await first.until(lambda: first.store.status(task_id) == "claimed", limit_ms=600)
    first.office.depose()
    await first.close()
    assert first.delivered() == []
    second = await engine_on_twins(store=first.store, streams=first.streams)
    second.clock.advance((first.clock.now() - second.clock.now()).total_seconds())
    await second.start()
    try:
        await second.until(lambda: second.ids() == [task_id])
        await second.until(lambda: second.store.status(task_id) == "fired")
        assert second.store.fire_log[0]["epoch"] == second.office.epoch
    finally:
        await second.close()


async def _publish_times(twin: Engine, count: int, limit_ms: int = 2_000) -> dict[str, int]:
    """Step the fake clock a millisecond at a time; the ms since T0 at which each of the
    first `count` deliveries was seen."""
    seen: dict[str, int] = {}
    for _ in range(limit_ms):
        await twin.settle()
        for task_id in twin.ids():
            seen.setdefault(task_id, to_ms(twin.clock.now()) - to_ms(T0))
        if len(seen) >= count:
            return seen
        twin.clock.advance(0.001)
    raise AssertionError(f"{len(seen)} of {count} delivered within {limit_ms} ms of fake time")


async def test_coalescing_publishes_dense_tasks_together_and_sparse_ones_on_time() -> None:
    """With SCHEDULER_DISPATCH_COALESCE=4ms, a task due after a quiet spell goes out at its
    millisecond; tasks falling due within 4 ms of a publish wait for the next one, together,
    at most 4 ms late and never early."""
    twin = await engine_on_twins(dispatch_coalesce="4ms")
    await twin.start()
    try:
        start = to_ms(twin.clock.now()) - to_ms(T0)
        due = {twin.send(delay_ms=d): start + d for d in (300, 301, 302, 303, 304, 500)}
        at = await _publish_times(twin, len(due))
    finally:
        await twin.close()
    # (the fake clock steps in float seconds, so a timer may fire one step late: 1 ms slack)
    late = {task_id: at[task_id] - due[task_id] for task_id in due}
    assert all(0 <= ms <= 4 + 1 for ms in late.values()), late
    first, *dense, sparse = due
    assert late[first] <= 1 and late[sparse] <= 1, late  # after a quiet spell: on time
    assert len({at[t] for t in dense}) <= 2, at  # the dense ones shared one or two publishes
    assert twin.ids() == list(due)  # firing order kept


async def test_without_coalescing_every_task_goes_out_at_its_millisecond(twin: Engine) -> None:
    """By default (no coalescing) tasks a millisecond apart are each published at their own
    due millisecond."""
    start = to_ms(twin.clock.now()) - to_ms(T0)
    due = {twin.send(delay_ms=d): start + d for d in (300, 301, 302, 303)}
    at = await _publish_times(twin, len(due))
    late = {task_id: at[task_id] - due[task_id] for task_id in due}
    assert all(0 <= ms <= 1 for ms in late.values()), late  # 1 ms: the fake clock's float steps
    assert len(set(at.values())) >= 3, at  # published apart, not gathered


async def test_a_term_ends_once_its_instance_holds_a_newer_epoch(twin: Engine) -> None:
    """Office lost and won again (a newer epoch) before the term looked: the old term ends
    and publishes nothing more. It went on as if it led (the office was held again, `lost`
    cleared), its writes fenced by the newer epoch, and held the new term back (2.1 s on a
    3-node cluster after a SIGSTOP of the lease's node)."""
    assert twin.runner is not None
    task_id = twin.send(5_000)
    await twin.until(lambda: task_id in twin.store.rows)
    newer = await twin.store.take_office("twin")
    twin.office.depose()
    twin.office.retake(newer)  # before the term's loops run again
    await twin.until(twin.runner.done, limit_ms=2_000)
    twin.clock.advance(6)
    await twin.settle()
    assert twin.ids() == [] and twin.store.status(task_id) == "pending"
