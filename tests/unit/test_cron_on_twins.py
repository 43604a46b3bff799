"""The cron engine on the in-memory twins with a fake clock: misfire policies, `forbid`, and a
failover that cannot double an occurrence (no server)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from scheduler.bus.memory import MemoryBroker, MemoryBus, MemoryStreams
from scheduler.clock import FakeClock, rfc3339, to_rfc3339
from scheduler.engine.cron_firing import CronEngine
from scheduler.engine.office import FixedOffice
from scheduler.errors import FencedError
from scheduler.metrics import Metrics
from scheduler.settings import Settings
from scheduler.store.memory import MemoryScheduleStore

T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


class Cron:
    def __init__(self, tmp_path: Path, jobs: str, store: MemoryScheduleStore | None = None):
        (tmp_path / "jobs.yaml").write_text("scheduled_jobs:\n" + jobs)
        self.clock = FakeClock(T0 + timedelta(milliseconds=300))
        self.streams = MemoryStreams(self.clock.monotonic)
        self.streams.add_stream("JOBS", ["mq.scheduled.>"])
        self.streams.add_stream("KV_scheduler_state", ["$KV.scheduler_state.>"])  # the mirror
        self.bus = MemoryBus(self.streams)
        self.store = store or MemoryScheduleStore()
        self.settings = Settings(schedules_dir=tmp_path, instance_id="twin")
        self.broker = MemoryBroker(self.streams)

    async def engine(self) -> tuple[CronEngine, int]:
        epoch = await self.store.office.take_office("twin")
        engine = CronEngine(
            self.settings, self.store, FixedOffice(epoch), self.clock, Metrics(), self.bus
        )
        await engine.sync()
        return engine, epoch

    def fired(self) -> list[str]:
        return [m.headers["Nats-Msg-Id"] for m in self.streams.messages("JOBS")]


def job(name: str, **keys: str) -> str:
    extra = "".join(f"    {k}: {v}\n" for k, v in keys.items())
    return f'  - name: {name}\n    subject: mq.scheduled.{name}\n    cron: "* * * * *"\n{extra}'


def key(name: str, minutes_ago: int) -> str:
    return f"{name}@{rfc3339(T0 - timedelta(minutes=minutes_ago))}"


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("skip", [0]),  # only the on-time occurrence
        ("fire_once", [0]),  # the most recent missed one (here: the on-time one)
        ("fire_all", [4, 3, 2, 1, 0]),  # every missed one, oldest first
    ],
)
async def test_missed_occurrences_follow_the_misfire_policy(
    tmp_path: Path, policy: str, expected: list[int]
) -> None:
    """Five minutes without a leader: each policy fires what docs/cron.md says, once."""
    cron = Cron(tmp_path, job("j", misfire=policy))
    cron.store.state["j"] = T0 - timedelta(minutes=5)
    engine, epoch = await cron.engine()
    cursors = await cron.store.cursors()
    await engine.tick(epoch, cron.broker, cursors)
    assert cron.fired() == [key("j", m) for m in expected]
    assert cron.store.state["j"] == T0
    await engine.tick(epoch, cron.broker, cursors)  # again at the same instant: nothing new
    assert len(cron.fired()) == len(expected)


async def test_a_late_leader_fires_once_the_latest_missed_occurrence(tmp_path: Path) -> None:
    """Taking office 2.5 minutes after the last fire: fire_once delivers the 2-minutes-ago
    occurrence (late, with its own scheduled time), skip delivers nothing."""
    cron = Cron(tmp_path, job("once", misfire="fire_once") + job("skip", misfire="skip"))
    cron.clock.advance(-0.3 + 150)  # T0 + 2.5 min: no occurrence is on time
    cron.store.state.update({"once": T0, "skip": T0})
    engine, epoch = await cron.engine()
    await engine.tick(epoch, cron.broker, await cron.store.cursors())
    assert cron.fired() == [key("once", -2)]
    assert cron.store.state == {"once": T0 + timedelta(minutes=2), "skip": T0 + timedelta(2 / 1440)}


async def test_forbid_skips_while_the_last_run_is_queued(tmp_path: Path) -> None:
    """A `forbid` job does not fire while its subject still holds a message; once a worker
    has acknowledged it, the next occurrence fires."""
    cron = Cron(tmp_path, job("f", concurrency="forbid"))
    cron.store.state["f"] = T0 - timedelta(minutes=1)
    engine, epoch = await cron.engine()
    cursors = await cron.store.cursors()
    await engine.tick(epoch, cron.broker, cursors)
    assert cron.fired() == [key("f", 0)]
    cron.clock.advance(60)
    await engine.tick(epoch, cron.broker, cursors)
    assert cron.fired() == [key("f", 0)]  # busy: skipped
    assert cron.store.state["f"] == T0 + timedelta(minutes=1)
    cron.streams.consume("JOBS", "mq.scheduled.f")
    cron.clock.advance(60)
    await engine.tick(epoch, cron.broker, cursors)
    assert cron.fired() == [key("f", -2)]


async def test_a_deposed_leader_cannot_move_cursors_and_its_heir_does_not_double(
    tmp_path: Path,
) -> None:
    """After a failover the old leader's bookkeeping is fenced; the new leader republishes the
    occurrence under the same Nats-Msg-Id, which the stream keeps once."""
    cron = Cron(tmp_path, job("h"))
    cron.store.state["h"] = T0 - timedelta(minutes=1)
    old, old_epoch = await cron.engine()
    heir, new_epoch = await cron.engine()  # takes office: a newer epoch
    with pytest.raises(FencedError):
        await old.tick(old_epoch, cron.broker, await cron.store.cursors())
    assert cron.store.state["h"] == T0 - timedelta(minutes=1)  # nothing recorded
    await heir.tick(new_epoch, cron.broker, await cron.store.cursors())
    assert cron.fired() == [key("h", 0)]  # the old leader's publish, deduplicated
    assert [e["epoch"] for e in cron.store.fire_log] == [new_epoch]


async def test_moved_cursors_are_mirrored_to_the_state_bucket(tmp_path: Path) -> None:
    """After a tick the moved cursor is copied to KV `scheduler_state` as `cron.<job>` with
    the occurrence, the epoch and the instance, through the term's broker."""
    cron = Cron(tmp_path, job("m"))
    cron.store.state["m"] = T0 - timedelta(minutes=1)
    engine, epoch = await cron.engine()
    await engine.tick(epoch, cron.broker, await cron.store.cursors())
    for _ in range(20):  # the mirror runs as its own task; its acks come from the loop
        await asyncio.sleep(0)
    held = cron.streams.messages("KV_scheduler_state")
    assert [m.subject for m in held] == ["$KV.scheduler_state.cron.m"]
    assert json.loads(held[0].payload) == {
        "last_scheduled_for": to_rfc3339(T0),
        "epoch": epoch,
        "instance": "twin",
    }
