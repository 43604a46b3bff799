"""A `pg_dump` taken mid-run, restored into a fresh database, and a daemon started on it
(docs/operations.md, "Backup and restore").

What the restore does, counted: no task fires early; the tasks that fired between the dump and
the restore are pending again in the dump, so they are published a second time and the target
stream's duplicate window drops them (each id is in the stream once); the cron job's cursor
moves back to the dump, so its occurrences since then are fired again (`misfire: fire_all`)
under the same `Nats-Msg-Id` and dropped the same way; a task accepted after the dump is lost
(it was acked off the intake); a cancel made after the dump is undone (the task fires).
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from scheduler import client
from scheduler.settings import Settings
from tests.support.helpers import DaemonRunner

TARGET = "mq.tasks.restore"
CRON = """\
scheduled_jobs:
  - name: restore-tick
    subject: mq.tasks.tick
    cron: "* * * * * *"
    misfire: fire_all
    data: {"kind": "tick"}
"""


def pg_tool(name: str) -> Path:
    """pgserver's bundled `pg_dump`/`pg_restore` (16: it reads the 15 of the compat run too;
    Debian's 15 client refuses a 16 server)."""
    try:
        from pgserver._commands import POSTGRES_BIN_PATH
    except ImportError:
        pytest.skip(f"no {name}: pgserver (the embedded extra) is not installed")
    tool = Path(POSTGRES_BIN_PATH) / name
    if not tool.is_file():
        pytest.skip(f"no {name} in {POSTGRES_BIN_PATH}")
    return tool


def dsn_for(dsn: str, database: str) -> str:
    base, _, query = dsn.partition("?")
    return f"{base.rpartition('/')[0]}/{database}" + (f"?{query}" if query else "")


def envelope(due: datetime) -> dict[str, Any]:
    return {
        "schema": "hanzo.mq.v1",
        "id": f"t_{uuid.uuid4().hex}",
        "type": "test.restore",
        "source": "tests",
        "timestamp": datetime.now(UTC).isoformat(),
        "delay_until": due.isoformat(),
        "data": {},
    }


async def stream_messages(nc: Client, stream: str = "TASKS") -> list[Msg]:
    """Every message the stream holds, read from the start."""
    js = nc.jetstream()
    total = (await js.stream_info(stream)).state.messages
    psub = await js.pull_subscribe(">", stream=stream)
    out: list[Msg] = []
    try:
        async with asyncio.timeout(10):
            while len(out) < total:
                out += await psub.fetch(min(500, total - len(out)), timeout=2)
    finally:
        await psub.unsubscribe()
    return out


async def fired_keys(dsn: str, kind: str, instance: str | None = None) -> set[str]:
    """What the fire log holds (task ids; `<job>@<occurrence>` for cron), of one instance if
    given."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT CASE kind WHEN 'cron' THEN key || '@' || scheduled_for::text ELSE key END "
            "AS key FROM fire_log WHERE kind = $1 AND instance = coalesce($2, instance)",
            kind,
            instance,
        )
    finally:
        await conn.close()
    return {r["key"] for r in rows}


async def cron_cursor(dsn: str) -> datetime:
    """The tick job's cursor: the last occurrence the database says it handled."""
    conn = await asyncpg.connect(dsn)
    try:
        cursor = await conn.fetchval(
            "SELECT last_scheduled_for FROM schedule_state WHERE name = 'restore-tick'"
        )
    finally:
        await conn.close()
    assert isinstance(cursor, datetime)
    return cursor


def scheduled_for(msg: Msg) -> datetime:
    assert msg.headers is not None
    return datetime.fromisoformat(msg.headers["Mq-Scheduled-For"].replace("Z", "+00:00"))


async def until_fired(dsn: str, ids: set[str], within: float, kind: str = "delayed") -> None:
    """Wait (bounded) until the fire log of `dsn` has every task of `ids` (with no `ids`: any
    entry of `kind`)."""
    async with asyncio.timeout(within):
        while not (ids <= (got := await fired_keys(dsn, kind)) and got):  # noqa: ASYNC110
            await asyncio.sleep(0.05)


@pytest.fixture
async def restored_dsn(pg_admin_dsn: str) -> AsyncIterator[str]:
    """An empty database (from template0) to restore into; dropped afterwards."""
    name = f"mqs_restore_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(pg_admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        yield dsn_for(pg_admin_dsn, name)
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await admin.close()


def run(*cmd: str | Path) -> None:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{cmd[0]} failed: {done.stderr.strip()}"


@pytest.mark.slow
async def test_a_restored_dump_fires_nothing_early_and_doubles_nothing_in_the_stream(
    settings: Settings,
    database_url: str,
    restored_dsn: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A daemon on a restore of a mid-run dump fires every task it holds, none early; what it
    fires twice (tasks and cron occurrences fired since the dump) is dropped by the stream's
    duplicate window; what was accepted or cancelled after the dump is lost or undone."""
    pg_dump, pg_restore = pg_tool("pg_dump"), pg_tool("pg_restore")
    assert settings.schedules_dir is not None
    (settings.schedules_dir / "tick.yaml").write_text(CRON)
    nc = await nats.connect(settings.nats_servers)
    runner = DaemonRunner(settings.with_overrides(backoff=timedelta(milliseconds=100)))
    try:
        js = nc.jetstream()
        await js.add_stream(name="TASKS", subjects=["mq.tasks.>"], duplicate_window=120)
        await runner.start()
        now = datetime.now(UTC)
        before = [envelope(now + timedelta(seconds=0.5)) for _ in range(5)]  # fired, in the dump
        between = [envelope(now + timedelta(seconds=2.5)) for _ in range(5)]  # fire before restore
        later = [envelope(now + timedelta(seconds=7)) for _ in range(5)]  # fire after restore
        for doc in before + between + later:
            await client.publish_delayed(js, TARGET, doc)
        due = {d["id"]: datetime.fromisoformat(d["delay_until"]) for d in before + between + later}
        await until_fired(database_url, {d["id"] for d in before}, 10)
        await until_fired(database_url, set(), 10, "cron")  # a cursor to dump

        dump = tmp_path / "mid-run.dump"
        await asyncio.to_thread(run, pg_dump, "-Fc", "-f", dump, "--dbname", database_url)

        lost = envelope(now + timedelta(seconds=2.5))  # accepted after the dump: not in it
        await client.publish_delayed(js, TARGET, lost)
        undone = later[0]  # cancelled after the dump: the restore brings it back
        assert (await client.cancel(nc, TARGET, undone["id"]))["status"] == "cancelled"
        want = {d["id"] for d in before + between} | {lost["id"]}
        await until_fired(database_url, want, 10)
        await runner.stop()
        stopped_at = datetime.now(UTC)
        assert stopped_at < due[later[1]["id"]], "too slow to stop before the later tasks"

        await asyncio.to_thread(
            run, pg_restore, "--no-owner", "--exit-on-error", "-d", restored_dsn, dump
        )
        dumped_cursor = await cron_cursor(restored_dsn)
        restored = await runner.start(database_url=restored_dsn, instance_id="restored")
        await until_fired(restored_dsn, {d["id"] for d in later}, 20)
        await runner.stop()
        refired = await fired_keys(restored_dsn, "delayed", "restored") - {d["id"] for d in later}
        msgs = await stream_messages(nc)
    finally:
        await runner.stop()
        await nc.close()

    tasks = [m for m in msgs if m.subject == TARGET]
    delivered = [m.headers["Nats-Msg-Id"] for m in tasks if m.headers]
    assert sorted(delivered) == sorted(set(delivered))  # nothing twice in the stream
    assert set(delivered) == set(due) | {lost["id"]}  # the cancel after the dump is undone
    for m in tasks:
        assert m.metadata.timestamp >= due.get((m.headers or {})["Nats-Msg-Id"], now)  # none early
    assert refired == {d["id"] for d in between}  # fired twice: exactly those since the dump
    assert lost["id"] not in refired

    ticks = [m for m in msgs if m.subject == "mq.tasks.tick" and m.headers]
    tick_ids = [m.headers["Nats-Msg-Id"] for m in ticks if m.headers]
    assert sorted(tick_ids) == sorted(set(tick_ids))  # each occurrence once in the stream
    first_run = [m for m in ticks if m.metadata.timestamp < stopped_at]
    since_dump = [m for m in first_run if scheduled_for(m) > dumped_cursor]
    published = restored.metrics.registry.get_sample_value(
        "mq_scheduler_fired_total", {"kind": "cron"}
    )
    new_ticks = len(ticks) - len(first_run)  # fired by the restored daemon only
    cron_refired = int(published or 0) - new_ticks
    assert cron_refired == len(since_dump) > 0  # the cursor went back: fired again, dropped
    seconds = sorted(scheduled_for(m) for m in ticks)  # the downtime caught up (fire_all):
    assert seconds == [seconds[0] + timedelta(seconds=i) for i in range(len(seconds))]
    with capsys.disabled():
        print(
            f"\n  restore: {len(refired)} tasks and {cron_refired} cron occurrences fired "
            f"again, all dropped by the duplicate window; 1 task lost, 1 cancel undone"
        )
