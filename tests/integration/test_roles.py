"""The PostgreSQL roles of docs/deploy.md: the owner migrates, the daemon runs with row rights."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from scheduler import migrate
from scheduler.settings import Settings
from tests.helpers import DaemonRunner, wait_until

DOCS = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"


def docs_sql() -> tuple[str, str]:
    """The superuser block and the owner block of the docs' roles section, as written there."""
    section = DOCS.read_text().split("## PostgreSQL roles and privileges", 1)[1].split("\n## ")[0]
    blocks = re.findall(r"```sql\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "docs/deploy.md: the roles section has two sql blocks"
    return blocks[0], blocks[1]


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


@pytest.fixture
async def roles(pg_admin_dsn: str) -> AsyncIterator[Roles]:
    """The docs' roles and database under unique names, created and dropped by this test."""
    tag = uuid.uuid4().hex[:8]
    owner, daemon = f"mqs_owner_{tag}", f"mqs_app_{tag}"

    def named(sql: str) -> str:
        return re.sub(r"\bmq_scheduler\b", daemon, sql.replace("mq_scheduler_owner", owner))

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
        )
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{daemon}" WITH (FORCE)')
        await admin.execute(f'DROP ROLE IF EXISTS "{daemon}"')
        await admin.execute(f'DROP ROLE IF EXISTS "{owner}"')
        await admin.close()


async def as_owner(roles: Roles, sql: str) -> None:
    conn = await asyncpg.connect(roles.owner_dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def test_daemon_role_of_the_docs_runs_the_daemon_and_its_partition_upkeep(
    roles: Roles, nats_url: str, tmp_path: Path
) -> None:
    """With the docs' grants, a daemon under the row-only role starts, leads, and creates and
    drops fire_log partitions through the upkeep function; it cannot change the schema."""
    await as_owner(roles, roles.owner_sql)
    await asyncio.to_thread(migrate.upgrade, roles.owner_dsn)
    (tmp_path / "schedules").mkdir()
    settings = Settings(
        nats_url=nats_url,
        database_url=roles.daemon_dsn,
        schedules_dir=tmp_path / "schedules",
        http_port=0,
        metrics_port=0,
        instance_id="roles-1",
        lease_ttl=3,
    )
    runner = DaemonRunner(settings)
    daemon = await runner.start()
    try:
        await wait_until(lambda: bool(daemon.leadership and daemon.leadership.role == "leader"), 10)
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
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("ALTER TABLE delayed_messages ADD COLUMN x INTEGER")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("CREATE TABLE mischief (x INTEGER)")
    finally:
        await conn.close()


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
