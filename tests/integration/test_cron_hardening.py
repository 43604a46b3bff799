"""Cron jobs whose target keeps failing, against real NATS and PostgreSQL: no spinning, no crash."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import nats.aio.msg
import pytest
from nats.js.api import DiscardPolicy, StreamConfig

from scheduler.backoff import JITTER
from scheduler.bus.nats.connection import NatsBus
from scheduler.bus.nats.publisher import Publisher
from scheduler.clock import SystemClock
from scheduler.engine.cron.firing import CronEngine
from scheduler.engine.office import FixedOffice
from scheduler.metrics import Metrics
from scheduler.records import PubAck, PublishError
from scheduler.settings import Settings
from scheduler.store.postgres.connect import PostgresStore, create_pool
from scheduler.store.postgres.cron_jobs import ScheduleStore
from scheduler.store.postgres.epoch import take_office
from tests.support.helpers import DaemonRunner, wait_until

NOWHERE = """\
scheduled_jobs:
  - name: nowhere
    subject: mq.scheduled.nowhere
    cron: "* * * * * *"
    data: {}
"""

CATCH_UP = """\
scheduled_jobs:
  - name: catchup
    subject: mq.scheduled.catchup
    cron: "* * * * * *"
    misfire: fire_all
    catchup_window: 1m
    data: {}
"""


async def test_a_job_whose_target_stream_is_full_backs_off(settings: Settings) -> None:
    """A job whose target stream refuses every message (full, discard new) is retried with
    growing, jittered waits (a handful of publishes in three seconds, not thousands), counted
    in a metric, and fires again once the stream has room."""
    (settings.schedules_dir / "jobs.yaml").write_text(NOWHERE)
    nc = await nats.connect(settings.nats_servers)
    js = nc.jetstream()
    await js.add_stream(
        name="FULL", subjects=["mq.scheduled.>"], max_msgs=1, discard=DiscardPolicy.NEW
    )
    await js.publish("mq.scheduled.other", b"{}")
    seen: list[float] = []

    async def count(msg: nats.aio.msg.Msg) -> None:
        seen.append(asyncio.get_running_loop().time())

    await nc.subscribe("mq.scheduled.nowhere", cb=count)
    runner = DaemonRunner(settings.with_overrides(backoff=timedelta(milliseconds=200)))
    try:
        daemon = await runner.start()
        await wait_until(lambda: len(seen) >= 1, within=10)
        await asyncio.sleep(3.0)
        attempts = len(seen)
        failures = _value(daemon.metrics, "cron_failures")
        backing_off = _value(daemon.metrics, "cron_backing_off")
        await js.update_stream(StreamConfig(name="FULL", subjects=["mq.scheduled.>"]))
        # A publish that reached the server just before the update was refused too, and its
        # retry waits out the next backoff: 0.2 s doubling per failure, +20 % jitter. So the
        # job's message is awaited for that long (plus 2 s), not for the next publish seen.
        refused = _value(daemon.metrics, "cron_failures") or 0.0
        held = 1
        async with asyncio.timeout(0.2 * 2.0**refused * (1 + JITTER) + 2.0):
            while held < 2:
                held = (await js.stream_info("FULL")).state.messages
                await asyncio.sleep(0.05)
    finally:
        await runner.stop()
        await nc.close()
    assert 2 <= attempts <= 8, f"{attempts} publishes in 3 s"
    assert failures is not None and failures >= attempts - 1
    assert backing_off == 1
    assert held >= 2  # the filler and the job's own
    assert _value(daemon.metrics, "cron_backing_off") == 0


def _value(metrics: Metrics, name: str) -> float | None:
    metric = getattr(metrics, name, None)  # None: the metric does not exist
    return None if metric is None else float(metric._value.get())


class FailingFirst:
    """The real publisher, except that the first publish of `subject` fails (a stream full
    at that instant, say): a tick's oldest occurrence fails while the later ones go through."""

    def __init__(self, publisher: Publisher, subject: str) -> None:
        self.publisher = publisher
        self.subject = subject
        self.failed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.publisher, name)

    async def publish(
        self, subject: str, payload: bytes, headers: dict[str, str]
    ) -> asyncio.Future[PubAck]:
        if subject == self.subject and not self.failed:
            self.failed += 1
            fut: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
            fut.set_exception(PublishError(subject, "maximum messages exceeded"))
            return fut
        return await self.publisher.publish(subject, payload, headers)


@pytest.fixture
async def cron_parts(settings: Settings) -> AsyncIterator[tuple[CronEngine, Any, int, Any]]:
    (settings.schedules_dir / "jobs.yaml").write_text(CATCH_UP)
    s = settings.with_overrides(backoff=timedelta(milliseconds=100))
    assert s.database_dsn is not None
    pool = await create_pool(s.database_dsn, min_size=1, max_size=2)
    bus = NatsBus(s, Metrics())
    await bus.connect(5)
    assert bus.nc is not None and bus.js is not None
    publisher = await Publisher(bus.nc, timeout=5).start()
    try:
        js = bus.js
        await js.add_stream(name="CATCHUP", subjects=["mq.scheduled.>"], duplicate_window=120)
        epoch = await take_office(pool, "cron-test")
        store = ScheduleStore(PostgresStore(pool, Metrics()))
        engine = CronEngine(s, store, FixedOffice(epoch), SystemClock(), Metrics(), bus)
        await engine.sync()
        yield engine, FailingFirst(publisher, "mq.scheduled.catchup"), epoch, js
    finally:
        await publisher.close()
        await bus.close()
        await pool.close()


async def test_fire_all_with_its_oldest_occurrence_failing_keeps_the_cursor_before_it(
    cron_parts: tuple[CronEngine, Any, int, Any],
) -> None:
    """fire_all catching up five occurrences whose oldest publish fails and the rest succeed:
    the tick does not raise, the cursor stays before the failed one, and after the backoff
    every occurrence is in the stream once."""
    engine, publisher, epoch, js = cron_parts
    now = datetime.now(UTC).replace(microsecond=0)
    start = now - timedelta(seconds=5)
    cursors = {"catchup": start}
    await engine.store.advance(epoch, [_advance(start)], "cron-test")
    await engine.tick(epoch, publisher, cursors)
    assert publisher.failed == 1
    assert (await engine.store.cursors())["catchup"] == start
    assert cursors["catchup"] == start
    await asyncio.sleep(0.3)  # past the first backoff (100 ms, +-20 %)
    await engine.tick(epoch, publisher, cursors)
    info = await js.stream_info("CATCHUP")
    assert cursors["catchup"] >= now
    msgs = await _read(js, info.state.messages)
    keys = [m.headers["Nats-Msg-Id"] for m in msgs]
    assert len(keys) == len(set(keys))
    firsts = sorted(datetime.fromisoformat(k.split("@", 1)[1]) for k in keys)
    assert firsts[0] == start + timedelta(seconds=1)
    assert firsts == [firsts[0] + timedelta(seconds=i) for i in range(len(firsts))]


def _advance(at: datetime) -> Any:
    from scheduler.records import Advance

    return Advance("catchup", "mq.scheduled.catchup", at)


async def _read(js: Any, count: int) -> list[Any]:
    psub = await js.pull_subscribe(">", stream="CATCHUP")
    try:
        return list(await psub.fetch(count, timeout=2))
    finally:
        await psub.unsubscribe()


# 12 aliases of one 100 KB string: a 100 KB file whose job's envelope passes 1 MiB
HUGE = (
    "scheduled_jobs:\n"
    "  - name: huge\n"
    "    subject: mq.scheduled.huge\n"
    '    cron: "* * * * * *"\n'
    "    data:\n"
    f"      p0: &blob {'x' * 100_000}\n"
    + "".join(f"      p{i}: *blob\n" for i in range(1, 12))
    + "  - name: every-second\n"
    "    subject: mq.scheduled.tick\n"
    '    cron: "* * * * * *"\n'
    "    data: {kind: tick}\n"
)


async def test_a_job_over_max_payload_is_stopped_once_and_the_others_keep_firing(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """On a real nats-server (max_payload 1 MiB), a job whose envelope is 1.2 MB is marked
    failed once with an error naming `data` (API and metric), never reaches its stream, and
    does not stop the other job; a resume tries it once more; a smaller `data` fires again."""
    from tests.integration.api.harness import READ, poll, running_api, write_jobs

    async with running_api(settings, HUGE) as api:
        daemon = await api.start()

        async def show() -> dict[str, Any]:
            return (await api.call("GET", "/v1/schedules/huge", token=READ)).body or {}

        job = await poll(show, lambda j: j.get("failed") is True, within=15)
        assert job["failed_reason"] == "too_large"
        assert job["failed_error"].startswith("data: envelope of 12002")
        assert "max_payload of 1048576 bytes" in job["failed_error"]
        listed = (await api.call("GET", "/v1/schedules", token=READ)).body["items"]
        assert {j["name"]: j["failed"] for j in listed} == {"huge": True, "every-second": False}
        ticks = len(await api.read_stream("SCHEDULED", quiet=0.3, subject="mq.scheduled.tick"))
        await asyncio.sleep(2.5)
        later = await api.read_stream("SCHEDULED", quiet=0.3, subject="mq.scheduled.tick")
        assert len(later) >= ticks + 2  # the other job kept firing, on the same connection
        failures = daemon.metrics.cron_permanent_failures_total.labels("too_large")
        assert failures._value.get() == 1 and daemon.metrics.cron_jobs_failed._value.get() == 1
        r = await api.call("POST", "/v1/schedules/huge/resume")
        assert r.status == 200 and r.body["status"] == "resumed"
        await poll(lambda: asyncio.sleep(0, failures._value.get()), lambda n: n == 2, within=10)
        assert (await show())["failed"] is True  # still too large: stopped again, once
        assert await api.read_stream("SCHEDULED", quiet=0.3, subject="mq.scheduled.huge") == []
        stops = [r for r in caplog.records if r.getMessage().startswith("cron.job_failed")]
        assert len(stops) == 2 and all("job=huge" in r.getMessage() for r in stops)
        write_jobs(settings, HUGE.replace("&blob " + "x" * 100_000, "&blob small"))
        await poll(show, lambda j: j.get("failed") is False, within=10)
        fired = await api.read_stream("SCHEDULED", quiet=0.5, subject="mq.scheduled.huge")
        for _ in range(20):
            if fired:
                break
            fired = await api.read_stream("SCHEDULED", quiet=0.5, subject="mq.scheduled.huge")
        assert fired and daemon.metrics.cron_jobs_failed._value.get() == 0
