"""What a task due at once was asked for (`Mq-Scheduled-For`, the fire log's `scheduled_for`):
its `delay_until` when that was still ahead as the lane stored it, else the lane's store time;
never after the daemon's now, always whole milliseconds."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from scheduler.bus.memory import MemoryBroker, MemoryStreams
from scheduler.clock import FakeClock, to_rfc3339
from scheduler.engine.delayed.horizon import Horizon
from scheduler.engine.delayed.intake import Intake
from scheduler.messages.envelope import Limits
from scheduler.metrics import Metrics
from scheduler.records import NewTask
from scheduler.settings import Settings
from scheduler.store.memory import MemoryTaskStore
from tests.unit.engine_twins import T0, Delivery

NOW = T0 + timedelta(microseconds=500_400)  # not a whole millisecond


def at_ms(ms: int) -> datetime:
    """T0 plus `ms` milliseconds."""
    return T0 + timedelta(milliseconds=ms)


@dataclass
class Stored:
    timestamp: datetime


@dataclass
class LaneDelivery(Delivery):
    """A lane message whose JetStream metadata says when the lane stored it."""

    stored: datetime | None = None

    @property
    def metadata(self) -> Any:
        return Stored(self.stored) if self.stored else super().metadata


def intake() -> Intake:
    clock = FakeClock(NOW)
    return Intake(
        settings=Settings(),
        horizon=Horizon(),
        tasks=MemoryTaskStore(now=clock.now),
        publisher=MemoryBroker(MemoryStreams(clock.monotonic)),
        clock=clock,
        events=Metrics(),
        limits=Limits(),
    )


def task(delay_until: datetime | None, stored: datetime | None) -> NewTask:
    doc: dict[str, Any] = {
        "schema": "hanzo.mq.v1",
        "id": "t-1",
        "type": "test.work",
        "source": "tests",
        "timestamp": to_rfc3339(T0 - timedelta(seconds=5)),
        "data": {},
    }
    if delay_until is not None:
        doc["delay_until"] = delay_until.isoformat()
    msg = LaneDelivery("mq.delay.tasks.work", json.dumps(doc).encode(), stored=stored)
    result = intake().validate(msg, NOW)
    assert isinstance(result, NewTask), result
    assert result.due_at >= NOW  # due at once: never before now
    return result


def test_a_delay_until_passed_while_on_the_lane_is_what_was_asked_for() -> None:
    """Stored 300 ms before its delay_until and validated 200 ms after it: scheduled for the
    delay_until, so the wait on the lane shows as lateness."""
    asked = NOW - timedelta(milliseconds=200)
    got = task(asked, stored=asked - timedelta(milliseconds=300))
    assert got.scheduled_for == at_ms(301)  # 12:00:00.3004, rounded up
    assert got.due_at == at_ms(501)


def test_a_delay_until_already_past_when_sent_is_scheduled_for_the_store_time() -> None:
    """A delay_until a day before the lane stored the task means "at once": scheduled for
    the store time (rounded up to the ms), not a day of lateness."""
    stored = NOW - timedelta(milliseconds=40, microseconds=250)
    got = task(NOW - timedelta(days=1), stored=stored)
    assert got.scheduled_for == at_ms(461)


def test_no_delay_until_is_scheduled_for_the_store_time() -> None:
    """Without delay_until the task was asked for when the lane stored it."""
    stored = NOW - timedelta(seconds=3)
    assert task(None, stored=stored).scheduled_for == at_ms(-2_499)  # 11:59:57.5004, rounded up


def test_a_store_time_ahead_of_our_clock_is_capped_at_now() -> None:
    """A server clock ahead of the daemon's cannot make the delivery look early: at most now,
    rounded up to the ms (which is also the due time)."""
    got = task(None, stored=NOW + timedelta(seconds=2))
    assert (
        got.scheduled_for
        == got.due_at
        == datetime(2026, 11, 22, 12, 0, 0, 501000, tzinfo=T0.tzinfo)
    )


def test_outside_jetstream_now_is_what_was_asked_for() -> None:
    """A message without JetStream metadata (the twins) is scheduled for now, rounded up."""
    got = task(None, stored=None)
    assert got.scheduled_for == got.due_at


def test_a_task_due_ahead_keeps_its_delay_until() -> None:
    """A delay_until still ahead is both the due time and the time asked for."""
    ahead = NOW + timedelta(seconds=10, microseconds=250)
    got = task(ahead, stored=NOW - timedelta(seconds=1))
    assert got.scheduled_for == got.due_at == at_ms(10_501)
