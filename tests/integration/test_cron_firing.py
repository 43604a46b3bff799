"""Cron jobs from YAML fired by the daemon against real NATS and PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import nats
import nats.aio.msg
import pytest
from nats.js.api import RetentionPolicy

from scheduler.settings import Settings
from tests.support.helpers import DaemonRunner


def write_jobs(directory: Path, body: str) -> None:
    (directory / "jobs.yaml").write_text("scheduled_jobs:\n" + body)


EVERY_SECOND = """\
  - name: tick
    subject: mq.scheduled.tick
    cron: "* * * * * *"
    data: {"kind": "tick"}
"""


class Cron(DaemonRunner):
    """The daemon under test, started and stopped as a test needs."""


@pytest.fixture
async def cron(settings: Settings) -> AsyncIterator[Cron]:
    nc = await nats.connect(settings.nats_servers)
    await nc.jetstream().add_stream(name="JOBS", subjects=["mq.scheduled.>"], duplicate_window=120)
    await nc.close()
    c = Cron(settings)
    try:
        yield c
    finally:
        await c.stop()


async def read_all(url: str, stream: str = "JOBS") -> list[nats.aio.msg.Msg]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        psub = await js.pull_subscribe(">", stream=stream)
        out = []
        while True:
            try:
                out += await psub.fetch(500, timeout=0.5)
            except TimeoutError:
                break
        for m in out:
            await m.ack()
        return out
    finally:
        await nc.close()


async def stream_count(url: str, stream: str = "JOBS") -> int:
    nc = await nats.connect(url)
    try:
        return int((await nc.jetstream().stream_info(stream)).state.messages)
    finally:
        await nc.close()


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.smoke
async def test_every_second_job_fires_each_occurrence_once(cron: Cron, database_url: str) -> None:
    """A 6-field every-second job delivers one fresh envelope per second, on time."""
    write_jobs(cron.settings.schedules_dir, EVERY_SECOND)
    await cron.start()
    await asyncio.sleep(3.6)
    await cron.stop()
    msgs = await read_all(cron.settings.nats_url or "")
    keys = [(m.headers or {})["Nats-Msg-Id"] for m in msgs]
    assert len(keys) == len(set(keys)) >= 2
    instants = sorted(ts((m.headers or {})["Mq-Scheduled-For"]) for m in msgs)
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(instants))
    for m in msgs:
        doc = json.loads(m.data)
        occurrence = ts((m.headers or {})["Mq-Scheduled-For"])
        assert (
            doc["id"] == (m.headers or {})["Nats-Msg-Id"] == f"tick@{occurrence:%Y-%m-%dT%H:%M:%S}Z"
        )
        assert doc["schema"] == "hanzo.mq.v1" and doc["source"] == "scheduler"
        assert doc["type"] == "scheduled.tick" and doc["data"] == {"kind": "tick"}
        assert (m.headers or {})["Mq-Schedule"] == "tick"
        assert timedelta(0) <= m.metadata.timestamp - occurrence < timedelta(milliseconds=500)
    conn = await asyncpg.connect(database_url)
    try:
        logged = await conn.fetchval("SELECT count(*) FROM fire_log WHERE kind = 'cron'")
        cursor = await conn.fetchval(
            "SELECT last_scheduled_for FROM schedule_state WHERE name = 'tick'"
        )
    finally:
        await conn.close()
    assert logged == len(msgs)
    assert cursor == instants[-1]
    nc = await nats.connect(cron.settings.nats_servers)
    try:
        entry = await (await nc.jetstream().key_value("scheduler_state")).get("cron.tick")
    finally:
        await nc.close()
    mirrored = ts(json.loads(entry.value or b"")["last_scheduled_for"])
    assert mirrored in instants  # copied off the firing path, at most about a second behind
    assert instants[-1] - mirrored <= timedelta(seconds=2)


@pytest.mark.slow
async def test_restart_neither_doubles_nor_skips(cron: Cron) -> None:
    """Stopping and starting the daemon leaves every second delivered exactly once."""
    write_jobs(
        cron.settings.schedules_dir,
        EVERY_SECOND.replace('"* * * * * *"', '"* * * * * *"\n    misfire: fire_all'),
    )
    for _ in range(2):
        await cron.start()
        await asyncio.sleep(2.2)
        await cron.stop()
    msgs = await read_all(cron.settings.nats_url or "")
    instants = sorted(ts((m.headers or {})["Mq-Scheduled-For"]) for m in msgs)
    assert len(instants) == len(set(instants))
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(instants))


async def test_downtime_fires_the_latest_missed_occurrence_once(
    cron: Cron, database_url: str
) -> None:
    """With fire_once, ten missed minutes give exactly one catch-up delivery: the latest."""
    write_jobs(
        cron.settings.schedules_dir,
        """\
  - name: minutely
    subject: mq.scheduled.minutely
    cron: "* * * * *"
    catchup_window: 1h
""",
    )
    await cron.start()
    conn = await asyncpg.connect(database_url)
    try:
        async with asyncio.timeout(5):
            while not await conn.fetchval("SELECT count(*) FROM schedule_state"):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        await cron.stop()
        await conn.execute(
            "UPDATE schedule_state SET last_scheduled_for = now() - interval '10 minutes'"
        )
    finally:
        await conn.close()
    restart = datetime.now(UTC)
    await cron.start()
    await asyncio.sleep(1.0)
    await cron.stop()
    msgs = await read_all(cron.settings.nats_url or "")
    fired = [ts((m.headers or {})["Mq-Scheduled-For"]) for m in msgs]
    # A minute boundary inside the second it runs adds that minute's regular fire: only the
    # occurrences before the restart are catch-ups.
    caught_up = [at for at in fired if at <= restart]
    assert len(caught_up) == 1 and len(fired) - len(caught_up) <= 1, fired
    latest = restart.replace(second=0, microsecond=0)
    assert caught_up[0] in {latest, latest - timedelta(minutes=1)}


async def test_removed_job_stops_firing_after_reload(cron: Cron) -> None:
    """Deleting a job from YAML and reloading (SIGHUP) stops it."""
    write_jobs(cron.settings.schedules_dir, EVERY_SECOND)
    daemon = await cron.start()
    await asyncio.sleep(1.5)
    write_jobs(cron.settings.schedules_dir, "")
    (cron.settings.schedules_dir / "jobs.yaml").write_text("scheduled_jobs: []\n")
    daemon.reload()
    await asyncio.sleep(0.5)
    before = await stream_count(cron.settings.nats_url or "")
    await asyncio.sleep(2.0)
    assert before >= 1
    assert await stream_count(cron.settings.nats_url or "") == before


async def test_forbid_skips_while_the_last_run_is_unacked(settings: Settings) -> None:
    """concurrency: forbid fires nothing new while the previous run waits unacked."""
    nc = await nats.connect(settings.nats_servers)
    js = nc.jetstream()
    await js.add_stream(
        name="WQ", subjects=["mq.scheduled.>"], retention=RetentionPolicy.WORK_QUEUE
    )
    await nc.close()
    write_jobs(settings.schedules_dir, EVERY_SECOND + "    concurrency: forbid\n")
    c = Cron(settings)
    daemon = await c.start()
    try:
        await asyncio.sleep(3.5)
    finally:
        await c.stop()
    nc = await nats.connect(settings.nats_servers)
    try:
        info = await nc.jetstream().stream_info("WQ")
    finally:
        await nc.close()
    assert info.state.messages == 1
    assert daemon.metrics.cron_skipped.labels("busy")._value.get() >= 1
