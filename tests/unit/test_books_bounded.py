"""Outcomes waiting for the books are bounded: a drain that outruns its bookkeeping stops
claiming until the books catch up, one booking never takes more than `BOOK_DEFER_MAX`
outcomes, and a delivered task keeps neither its bytes nor its headers while it waits."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest

from scheduler.clock import FakeClock
from scheduler.engine.delayed import dispatch
from scheduler.records import Fired, PubAck, PublishError
from tests.unit.engine_twins import T0, engine_on_twins
from tests.unit.test_armed import firing, task


def test_a_delivered_task_waits_for_the_books_without_its_bytes_or_headers() -> None:
    """An acknowledged publish leaves an outcome that holds no payload or headers (the books
    need neither), while a failed one keeps them for its retry or dead letter."""
    f = firing(FakeClock(T0))
    ok, failed = task("ok", 1, size=300), task("bad", 2, size=300)
    ok.headers, failed.headers = {"traceparent": "00-x"}, {"traceparent": "00-y"}
    f._done(ok, PubAck("TASKS", 1, False))
    f._done(failed, PublishError("mq.tasks.x", "timeout", in_doubt=True))
    assert (ok.payload, ok.headers) == (b"", {})
    assert len(failed.payload) == 300 and failed.headers == {"traceparent": "00-y"}
    assert f.unbooked() == 2


async def test_a_drain_waits_for_stalled_books_and_books_in_bounded_flushes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """300 tasks due at one instant while `mark_fired` hangs: claiming stops once the
    unbooked outcomes reach the bound (far fewer than 300 go out; the armed set holds 20 of
    them), and once the books move
    again every task fires once, each flush at most `BOOK_DEFER_MAX` outcomes."""
    monkeypatch.setattr(dispatch, "BOOK_DEFER_MAX", 10)
    monkeypatch.setattr(dispatch, "UNBOOKED_MAX", 25)
    twin = await engine_on_twins(batch=5, armed_max=20)
    release = asyncio.Event()
    flushes: list[int] = []
    real = twin.store.mark_fired

    async def stalled(epoch: int, fired: Sequence[Fired], instance: str) -> Any:
        await release.wait()
        flushes.append(len(fired))
        return await real(epoch, fired, instance)

    monkeypatch.setattr(twin.store, "mark_fired", stalled)
    await twin.start()
    try:
        ids = [twin.send(delay_ms=200) for _ in range(300)]
        await twin.until(lambda: len(twin.ids()) >= 25, limit_ms=2_000)
        for _ in range(300):  # plenty of time for the drain, were it not held back
            twin.clock.advance(0.001)
            await twin.settle()
        held = len(twin.ids())
        release.set()
        await twin.until(lambda: len(twin.ids()) >= 300, limit_ms=5_000)
        await twin.until(lambda: all(twin.store.status(i) == "fired" for i in ids))
    finally:
        release.set()
        await twin.close()
    # the bound, plus what was armed (20) or being claimed (4 claims of 5) when it was reached
    assert 25 <= held <= 25 + 20 + 4 * 5
    assert sorted(twin.ids()) == sorted(ids)
    assert flushes and max(flushes) <= 10


async def test_a_failed_publish_is_booked_at_once_not_at_the_next_flush(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With deliveries booked only every 5 s, a publish that fails is still recorded (put
    back with its error, to retry after its backoff) within a few milliseconds."""
    from scheduler.records import PublishError

    monkeypatch.setattr(dispatch, "BOOK_EVERY", 5.0)
    twin = await engine_on_twins(backoff="50ms")
    await twin.start()
    broker = twin.bus.publishers[0]
    failures = iter([PublishError("mq.inference.chat", "no responders", in_doubt=False)])
    broker.fail = lambda subject: next(failures, None)
    try:
        task_id = twin.send(delay_ms=100)
        await twin.until(lambda: task_id in twin.store.rows, limit_ms=1_000)
        due = twin.store.rows[task_id].task.due_at
        took = await twin.until(
            lambda: twin.store.rows[task_id].last_error is not None, limit_ms=1_000
        )
        assert twin.clock.now() - due < timedelta(milliseconds=50)
        await twin.until(lambda: task_id in twin.ids(), limit_ms=2_000)  # the retry goes out
    finally:
        await twin.close()
    assert took < 1_000 and twin.ids() == [task_id]
