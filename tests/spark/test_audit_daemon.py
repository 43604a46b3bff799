"""End to end: the daemon fires real cron jobs and delayed tasks, `export-log` writes its log and
the audit finds every occurrence delivered once and none early."""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import nats
import pytest

from scheduler import client
from scheduler.settings import Settings
from tests.integration.test_delayed import envelope
from tests.spark.conftest import run_audit
from tests.support.helpers import DaemonRunner

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]

JOBS = """\
scheduled_jobs:
  - {name: every-second, subject: mq.scheduled.tick, cron: "* * * * * *"}
  - {name: every-other, subject: mq.scheduled.tock, cron: "*/2 * * * * *"}
"""
TASKS = 40


async def count(database_url: str, sql: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


async def test_daemon_log_audits_clean(spark: Any, settings: Settings, tmp_path: Path) -> None:
    """Cron jobs and delayed tasks fired by a real daemon, exported and audited: zero missed,
    zero doubled, zero early, and every delayed task delivered."""
    (settings.schedules_dir / "jobs.yaml").write_text(JOBS)
    url = settings.database_url.get_secret_value() if settings.database_url else ""
    nc = await nats.connect(settings.nats_servers)
    js = nc.jetstream()
    await js.add_stream(name="WORK", subjects=["mq.scheduled.>", "mq.tasks.>"])
    runner = DaemonRunner(settings)
    try:
        await runner.start()
        async with asyncio.timeout(20):
            while await count(url, "SELECT count(*) FROM schedule_state") < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        since = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
        for i in range(TASKS):
            due = since + timedelta(milliseconds=100 * i + 7)
            await client.publish_delayed(js, f"mq.tasks.t{i % 3}", envelope(due), None)
        await asyncio.sleep((since + timedelta(seconds=6) - datetime.now(UTC)).total_seconds())
        async with asyncio.timeout(10):
            sql = "SELECT count(*) FROM fire_log WHERE kind = 'delayed'"
            while await count(url, sql) < TASKS:  # noqa: ASYNC110 (rows in PostgreSQL)
                await asyncio.sleep(0.05)
        until = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    finally:
        await runner.stop()
        await nc.close()
    day_end = datetime.combine(since.date() + timedelta(days=1), datetime.min.time(), UTC)
    until = min(until, day_end)
    log = tmp_path / "log.jsonl"
    export = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "scheduler",
        "export-log",
        "--date",
        since.date().isoformat(),
        "--out",
        str(log),
        env={**os.environ, "SCHEDULER_DATABASE_URL": url},
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        _, err = await export.communicate()
    assert export.returncode == 0, err.decode()
    # the daemon has stopped: the audit may hold this loop (main() wants the main thread)
    run = run_audit(
        tmp_path / "out",
        "--date",
        since.date().isoformat(),
        "--input",
        str(log),
        "--schedules",
        str(settings.schedules_dir),
        "--from",
        since.isoformat(),
        "--until",
        until.isoformat(),
        "--fail-on-slo",
    )
    assert run.code == 0, run.stderr + run.stdout
    summary = run.summary
    seconds = int((until - since).total_seconds())
    tick, tock = summary["schedules"]["every-second"], summary["schedules"]["every-other"]
    assert tick["expected"] == seconds >= 5
    assert tock["expected"] in (seconds // 2, seconds // 2 + 1)
    for job in (tick, tock):
        assert job["fired"] == job["expected"]
        assert (job["missed"], job["doubled"], job["early"], job["unexpected"]) == (0, 0, 0, 0)
    delayed = summary["totals"]["delayed"]
    assert (delayed["fired"], delayed["doubled"], delayed["early"]) == (TASKS, 0, 0)
    assert summary["slo"]["ok"] is True
