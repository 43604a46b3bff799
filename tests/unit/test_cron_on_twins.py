"""The cron engine on the in-memory twins with a fake clock: misfire policies, `forbid`, and a
failover that cannot double an occurrence (no server)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from scheduler.bus.memory import MemoryBroker, MemoryBus, MemoryStreams
from scheduler.clock import FakeClock, rfc3339, to_rfc3339
from scheduler.engine.cron.firing import CronEngine
from scheduler.engine.office import FixedOffice
from scheduler.errors import FencedError
from scheduler.metrics import Metrics
from scheduler.records import PublishError
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
        self.metrics = Metrics()

    async def engine(self) -> tuple[CronEngine, int]:
        epoch = await self.store.office.take_office("twin")
        engine = CronEngine(
            self.settings, self.store, FixedOffice(epoch), self.clock, self.metrics, self.bus
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
    """Five minutes without a leader: each policy fires what docs/cron.md says, once, and
    the fire log holds each delivery (fire_all logged only the last of its five: seen
    failing)."""
    cron = Cron(tmp_path, job("j", misfire=policy))
    cron.store.state["j"] = T0 - timedelta(minutes=5)
    engine, epoch = await cron.engine()
    cursors = await cron.store.cursors()
    await engine.tick(epoch, cron.broker, cursors)
    assert cron.fired() == [key("j", m) for m in expected]
    logged = [e["scheduled_for"] for e in cron.store.fire_log if e["key"] == "j"]
    assert logged == [T0 - timedelta(minutes=m) for m in expected]
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


class Counting(MemoryBroker):
    """A twin broker that counts the publishes offered per subject (sent or refused)."""

    def __init__(self, streams: MemoryStreams, max_payload: int) -> None:
        super().__init__(streams, max_payload=max_payload)
        self.offered: dict[str, int] = {}

    async def publish(self, subject: str, payload: bytes, headers: Any) -> Any:
        if subject.startswith("mq."):  # not the cursor mirror's KV writes
            self.offered[subject] = self.offered.get(subject, 0) + 1
        return await super().publish(subject, payload, headers)


BIG = "{ blob: " + "x" * 3000 + " }"


async def test_a_job_too_large_to_publish_fails_once_and_the_others_keep_firing(
    tmp_path: Path,
) -> None:
    """A job whose envelope exceeds max_payload is offered to the broker once, marked failed
    with an error naming `data` and both sizes, counted, and never offered again; the other
    job fires every minute meanwhile."""
    cron = Cron(tmp_path, job("big", data=BIG) + job("small"))
    cron.store.state.update(big=T0 - timedelta(minutes=1), small=T0 - timedelta(minutes=1))
    broker = Counting(cron.streams, max_payload=2048)
    engine, epoch = await cron.engine()
    cursors = await cron.store.cursors()
    for minute in range(4):
        await engine.tick(epoch, broker, cursors)
        cron.clock.advance(60)
        assert cron.fired()[-1] == key("small", -minute)
    assert broker.offered == {"mq.scheduled.big": 1, "mq.scheduled.small": 4}
    failure = cron.store.failures["big"]
    assert failure.reason == "too_large" and failure.scheduled_for == T0
    assert failure.error.startswith("data: envelope of 31")
    assert "does not fit the server's max_payload of 2048 bytes" in failure.error
    assert engine.failed == frozenset({"big"})
    assert cron.metrics.cron_permanent_failures_total.labels("too_large")._value.get() == 1
    assert cron.metrics.cron_jobs_failed._value.get() == 1
    assert cron.metrics.cron_backing_off._value.get() == 0  # not a retry
    assert cron.store.state["big"] == T0 + timedelta(minutes=3)  # held like a paused job


async def test_a_failed_job_stays_stopped_for_the_next_leader(tmp_path: Path) -> None:
    """The failed mark is kept in the store: a leader taking office later does not offer the
    job again while its definition is the same."""
    cron = Cron(tmp_path, job("big", data=BIG))
    cron.store.state["big"] = T0 - timedelta(minutes=1)
    broker = Counting(cron.streams, max_payload=2048)
    first, epoch = await cron.engine()
    await first.tick(epoch, broker, await cron.store.cursors())
    heir, new_epoch = await cron.engine()
    cron.clock.advance(60)
    await heir.tick(new_epoch, broker, await cron.store.cursors())
    assert broker.offered == {"mq.scheduled.big": 1}
    assert heir.failed == frozenset({"big"}) and cron.fired() == []


async def test_a_changed_definition_or_a_resume_makes_a_failed_job_fire_again(
    tmp_path: Path,
) -> None:
    """Editing the YAML clears the failed mark (the fixed job fires at its next occurrence,
    without replaying the minutes it was stopped); an operator's resume clears it too."""
    cron = Cron(tmp_path, job("big", data=BIG))
    cron.store.state["big"] = T0 - timedelta(minutes=1)
    broker = Counting(cron.streams, max_payload=2048)
    engine, epoch = await cron.engine()
    cursors = await cron.store.cursors()
    await engine.tick(epoch, broker, cursors)
    cron.clock.advance(120)
    await engine.tick(epoch, broker, cursors)
    (tmp_path / "jobs.yaml").write_text("scheduled_jobs:\n" + job("big", data="{ blob: x }"))
    await engine.sync()
    assert engine.failed == frozenset() and cron.store.failures == {}
    await engine.tick(epoch, broker, cursors)
    assert cron.fired() == []  # 12:02 went by while it was stopped: not replayed
    cron.clock.advance(60)
    await engine.tick(epoch, broker, cursors)
    assert cron.fired() == [key("big", -3)]
    (tmp_path / "jobs.yaml").write_text("scheduled_jobs:\n" + job("big", data=BIG))
    await engine.sync()
    cron.clock.advance(60)
    await engine.tick(epoch, broker, cursors)  # the large definition again: fails once more
    assert engine.failed == frozenset({"big"}) and broker.offered["mq.scheduled.big"] == 3
    assert await cron.store.set_paused("big", None)  # resume, after max_payload was raised
    await engine.sync()
    cron.clock.advance(60)
    await engine.tick(epoch, MemoryBroker(cron.streams, max_payload=1 << 20), cursors)
    assert cron.fired()[-1] == key("big", -5) and engine.failed == frozenset()


async def test_a_transient_failure_still_backs_off_and_is_not_marked_failed(
    tmp_path: Path,
) -> None:
    """A failure that is not permanent (a stream refusing for now) keeps the backoff: the job
    is retried after its wait and never marked failed."""
    cron = Cron(tmp_path, job("t"))
    cron.store.state["t"] = T0 - timedelta(minutes=1)
    broker = MemoryBroker(cron.streams)
    broker.fail = lambda subject: PublishError(subject, "stream full")
    engine, epoch = await cron.engine()
    cursors = await cron.store.cursors()
    await engine.tick(epoch, broker, cursors)
    assert cron.metrics.cron_backing_off._value.get() == 1
    assert engine.failed == frozenset() and cron.store.failures == {}
    broker.fail = None
    cron.clock.advance(5)
    await engine.tick(epoch, broker, cursors)
    assert cron.fired() == [key("t", 0)]
