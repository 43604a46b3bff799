"""The PostgreSQL roles of docs/security.md: the owner migrates, the daemon runs with row rights
(a delayed task's whole round trip under them), cannot change the schema, and its credential
rotates between two login roles without downtime."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import nats
import pytest

from scheduler import client
from scheduler.daemon.lifecycle import Daemon, migrate
from scheduler.settings import Settings
from tests.support.helpers import DaemonRunner, wait_until

DOCS = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def docs_sql() -> tuple[str, str]:
    """The superuser block and the owner block of the docs' roles section, as written there."""
    section = DOCS.read_text().split("## PostgreSQL privileges", 1)[1].split("\n## ")[0]
    blocks = re.findall(r"```sql\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "docs/security.md: the privileges section has two sql blocks"
    return blocks[0], blocks[1]


def docs_rotation_sql() -> str:
    """The statement of docs/security.md's PostgreSQL rotation that adds the second role."""
    section = DOCS.read_text().split("## Credential rotation without downtime", 1)[1]
    blocks: list[str] = re.findall(r"```sql\n(.*?)```", section.split("\n## ")[0], re.S)
    assert len(blocks) == 1, "docs/security.md: the rotation section has one sql block"
    return blocks[0]


def dsn_as(admin_dsn: str, user: str, database: str) -> str:
    parts = urlsplit(admin_dsn)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}", path=f"/{database}"))


@dataclass
class Roles:
    owner_dsn: str
    daemon_dsn: str
    owner: str
    daemon: str
    owner_sql: str  # the docs' owner block under this test's names
    second: str  # the rotation's second login role
    second_dsn: str
    rotation_sql: str  # the docs' rotation statement under this test's names


@pytest.fixture
async def roles(pg_admin_dsn: str) -> AsyncIterator[Roles]:
    """The docs' roles and database under unique names, created and dropped by this test."""
    tag = uuid.uuid4().hex[:8]
    owner, daemon = f"mqs_owner_{tag}", f"mqs_app_{tag}"

    second = f"{daemon}_b"

    def named(sql: str) -> str:
        sql = sql.replace("mq_scheduler_owner", owner).replace("mq_scheduler_b", second)
        return re.sub(r"\bmq_scheduler\b", daemon, sql)

    superuser_sql, owner_sql = docs_sql()
    admin = await asyncpg.connect(pg_admin_dsn)
    try:
        if not await admin.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user"):
            pytest.skip("the test PostgreSQL's admin role is not a superuser: cannot create roles")
        for statement in named(superuser_sql).split(";"):
            if statement.strip():
                await admin.execute(statement)
        yield Roles(
            owner_dsn=dsn_as(pg_admin_dsn, owner, daemon),
            daemon_dsn=dsn_as(pg_admin_dsn, daemon, daemon),
            owner=owner,
            daemon=daemon,
            owner_sql=named(owner_sql),
            second=second,
            second_dsn=dsn_as(pg_admin_dsn, second, daemon),
            rotation_sql=named(docs_rotation_sql()),
        )
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{daemon}" WITH (FORCE)')
        await admin.execute(f'DROP ROLE IF EXISTS "{second}"')
        await admin.execute(f'DROP ROLE IF EXISTS "{daemon}"')
        await admin.execute(f'DROP ROLE IF EXISTS "{owner}"')
        await admin.close()


async def as_owner(roles: Roles, sql: str) -> None:
    conn = await asyncpg.connect(roles.owner_dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def daemon_settings(nats_url: str, dsn: str, tmp_path: Path, instance: str) -> Settings:
    (tmp_path / "schedules").mkdir(exist_ok=True)
    return Settings(
        nats_url=nats_url,
        database_url=dsn,
        schedules_dir=tmp_path / "schedules",
        data_dir=tmp_path / f"data-{instance}",
        http_port=0,
        metrics_port=0,
        instance_id=instance,
        lease_ttl=3,
    )


def leads(daemon: Daemon) -> bool:
    return bool(daemon.leadership and daemon.leadership.role == "leader")


async def round_trip(nats_url: str, dsn: str) -> str:
    """Send a task due in 300 ms through the delay lane; once delivered to its target stream,
    wait until PostgreSQL has it fired with a fire-log row; the instance that fired it."""
    task_id = f"t_{uuid.uuid4().hex}"
    doc = {
        "schema": "hanzo.mq.v1",
        "id": task_id,
        "type": "roles.test",
        "source": "tests",
        "timestamp": datetime.now(UTC).isoformat(),
        "delay_until": (datetime.now(UTC) + timedelta(milliseconds=300)).isoformat(),
        "data": {},
    }
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="TASKS", subjects=["mq.tasks.>"])
        target = f"mq.tasks.roles.{task_id}"
        await client.publish_delayed(js, target, doc)
        psub = await js.pull_subscribe(target, durable=None, stream="TASKS")
        try:
            (msg,) = await psub.fetch(1, timeout=10)
        finally:
            await psub.unsubscribe()
        assert msg.headers is not None and msg.headers["Nats-Msg-Id"] == task_id
    finally:
        await nc.close()
    conn = await asyncpg.connect(dsn)
    try:
        async with asyncio.timeout(10):
            while (instance := await conn.fetchval(FIRED_BY, task_id)) is None:  # noqa: ASYNC110 (a server's state, no event)
                await asyncio.sleep(0.05)
    finally:
        await conn.close()
    return str(instance)


FIRED_BY = (
    "SELECT f.instance FROM fire_log f JOIN fired_tasks d ON d.id = f.key "
    "WHERE f.kind = 'delayed' AND f.key = $1"
)

REFUSED = [
    "ALTER TABLE delayed_messages ADD COLUMN x INTEGER",
    "CREATE TABLE mischief (x INTEGER)",
    "DROP TABLE delayed_messages",
    "TRUNCATE delayed_messages",
    "DROP FUNCTION scheduler_fire_log_upkeep(INTEGER, INTEGER)",
    "CREATE INDEX mischief ON delayed_messages (target)",
    "ALTER FUNCTION scheduler_fire_log_upkeep(INTEGER, INTEGER) SECURITY INVOKER",
]


async def test_daemon_role_of_the_docs_runs_a_round_trip_and_its_partition_upkeep(
    roles: Roles, nats_url: str, tmp_path: Path
) -> None:
    """With the docs' grants, a daemon under the row-only role starts, leads, fires a delayed
    task end to end (intake, store, claim, publish, fire log), and creates and drops fire_log
    partitions through the upkeep function; the role cannot alter, drop, truncate or create."""
    await as_owner(roles, roles.owner_sql)
    await asyncio.to_thread(migrate.upgrade, roles.owner_dsn)
    runner = DaemonRunner(daemon_settings(nats_url, roles.daemon_dsn, tmp_path, "roles-1"))
    daemon = await runner.start()
    try:
        await wait_until(lambda: leads(daemon), 10)
        assert await round_trip(nats_url, roles.daemon_dsn) == "roles-1"
        assert daemon.store is not None
        changes = await daemon.store.fire_log_upkeep(retention_days=14, ahead_days=5)
        assert any(c.startswith("created fire_log_p") for c in changes), changes
    finally:
        await runner.stop()
    conn = await asyncpg.connect(roles.daemon_dsn)
    try:
        owners = await conn.fetch(
            "SELECT DISTINCT pg_get_userbyid(relowner) AS owner FROM pg_class "
            "WHERE relname LIKE 'fire_log_p%' AND relkind = 'r'"
        )
        assert [r["owner"] for r in owners] == [roles.owner]
        for statement in REFUSED:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(statement)
    finally:
        await conn.close()


async def test_the_daemon_role_rotates_to_a_second_login_without_downtime(
    roles: Roles, pg_admin_dsn: str, nats_url: str, tmp_path: Path
) -> None:
    """docs/security.md's rotation: a second login role made a member of the daemon's role
    inherits its grants; a daemon under it joins while the old one leads, takes over when the
    old one stops (rolling restart), and fires tasks."""
    await as_owner(roles, roles.owner_sql)
    await asyncio.to_thread(migrate.upgrade, roles.owner_dsn)
    old = DaemonRunner(daemon_settings(nats_url, roles.daemon_dsn, tmp_path, "roles-old"))
    new = DaemonRunner(daemon_settings(nats_url, roles.second_dsn, tmp_path, "roles-new"))
    try:
        first = await old.start()
        await wait_until(lambda: leads(first), 10)
        admin = await asyncpg.connect(pg_admin_dsn)
        try:
            await admin.execute(roles.rotation_sql)
        finally:
            await admin.close()
        second = await new.start()
        assert await round_trip(nats_url, roles.daemon_dsn) == "roles-old"
        await old.stop()
        await wait_until(lambda: leads(second), 10)
        assert await round_trip(nats_url, roles.second_dsn) == "roles-new"
    finally:
        await new.stop()
        await old.stop()


async def test_a_role_without_the_grant_cannot_run_the_upkeep(roles: Roles) -> None:
    """The upkeep runs with the owner's rights, so only roles granted EXECUTE may call it (a
    stranger could otherwise drop the fire log's partitions)."""
    await asyncio.to_thread(migrate.upgrade, roles.owner_dsn)
    conn = await asyncpg.connect(roles.daemon_dsn)
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetch("SELECT * FROM scheduler_fire_log_upkeep(0, 0)")
    finally:
        await conn.close()
